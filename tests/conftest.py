import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_checks", False)

# eqopt checks its public boundary itself (docs/design.md, "Type checking"); the
# tests check its private helpers too, with this import hook, installed before any
# of eqopt's modules is imported.
import _checking_hook  # noqa: E402
import jaxtyping  # noqa: E402

_checking_hook.install()

import eqopt  # noqa: E402,F401
import eqopt._typecheck  # noqa: E402

# In a user's process eqopt's calls to its own public functions are not checked
# again; here they are.
eqopt._typecheck.CHECK_CALLS_FROM_EQOPT = True

assert not jaxtyping.config.jaxtyping_disable, "tests must run with type checking on"

import _oracles  # noqa: E402

_oracle_skips: set[str] = set()


def pytest_runtest_logreport(report):
    # With xdist the controller sees every worker's reports; recording there only.
    if _oracles.is_oracle_skip(report):
        _oracle_skips.add(report.nodeid)


def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):
        _oracles.write_oracle_skips(_oracle_skips)
