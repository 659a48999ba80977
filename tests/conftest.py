import os

# The tests compile thousands of small programs and run each for microseconds:
# XLA's backend optimisations (LLVM's) cost more compile time than they save
# (skipping them took 30% off the CPU time of a compile-bound test file).
# Subprocesses that run an example at full speed set their own flags.
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0",
)

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


# Every executable XLA's CPU backend compiles holds about 14 memory mappings for as
# long as JAX caches it, and a process may hold at most `vm.max_map_count` (65530
# by default) of them. A test worker compiles thousands of programs over the suite;
# past that limit the next compilation's `mmap` fails and XLA's compiler crashes
# the worker (seen twice in CI, in tests/test_train_state.py, late in the run).
# Clearing JAX's caches when a worker nears the limit keeps it well below.
_MAPPINGS_LIMIT = 24_000


def _mappings() -> int:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return maps.read().count(b"\n")
    except OSError:  # not Linux: no such limit to guard
        return 0


def pytest_runtest_teardown(item, nextitem):
    if _mappings() > _MAPPINGS_LIMIT:
        jax.clear_caches()
