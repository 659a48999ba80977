"""The report of parameter groups: who got what, and the rates in use."""

import re
from typing import NamedTuple

import equinox as eqx
import numpy as np

from ._current import current_hyperparams, step_count
from ._param_groups import ParamGroups, ParamGroupsState
from ._typecheck import checked


class ReportRow(NamedTuple):
    """One row of a `eqopt.GroupReport`: a group (a group's leaves in one layer)."""

    group: str
    layer: int | None
    paths: tuple[str, ...]
    size: int
    lr_mult: float
    wd_mult: float
    learning_rate: float | None
    weight_decay: float | None


@checked
class GroupReport(eqx.Module):
    """Who got what: made by `eqopt.param_groups_report`; `print` it.

    One line per group: the paths it took, collapsed where they repeat
    (`blocks[0-23].norm.weight`), the number of parameters, the multipliers
    (`lr x`, `wd x`) and the learning rate and weight decay in use at the state's
    step (the optimiser's values there times the multipliers). With layer
    decay, the layers a group spans and the range of its rates; with
    `by_layer=True`, one line per group and layer. `rows` holds each group and
    layer's numbers.
    """

    rows: tuple[ReportRow, ...]
    step: int | None
    by_layer: bool = eqx.field(default=False, static=True)

    def _lines(self) -> list[ReportRow | list[ReportRow]]:
        if self.by_layer:
            return list(self.rows)
        merged: dict[str, list[ReportRow]] = {}
        for row in self.rows:
            merged.setdefault(row.group, []).append(row)
        return list(merged.values())

    def __str__(self) -> str:
        layered = any(row.layer is not None for row in self.rows)
        header = ("group", "layer", "params", "lr x", "lr", "wd x", "wd", "paths")
        table: list[tuple[str, ...]] = [header]
        for line in self._lines():
            rows = line if isinstance(line, list) else [line]
            layers = [r.layer for r in rows if r.layer is not None]
            paths = collapse([p for r in rows for p in r.paths])
            table.append(
                (
                    rows[0].group,
                    _ranges(layers) if layers else "-",
                    f"{sum(r.size for r in rows):,}",
                    _span([r.lr_mult for r in rows], "x{:.3g}"),
                    _span([r.learning_rate for r in rows], "{:.3g}"),
                    _span([r.wd_mult for r in rows], "x{:.3g}"),
                    _span([r.weight_decay for r in rows], "{:.3g}"),
                    paths[0] if paths else "",
                )
            )
            table.extend(("",) * 7 + (more,) for more in paths[1:])
        # Without layer decay, no layer column.
        columns = [i for i in range(len(header)) if layered or i != 1]
        table = [tuple(line[i] for i in columns) for line in table]
        widths = [max(len(line[i]) for line in table) for i in range(len(columns) - 1)]
        left = {0, 1} if layered else {0}
        lines = [
            "  ".join(
                [
                    cell.ljust(w) if i in left else cell.rjust(w)
                    for i, (cell, w) in enumerate(zip(line[:-1], widths, strict=True))
                ]
                + [line[-1]]
            ).rstrip()
            for line in table
        ]
        total = sum(row.size for row in self.rows)
        title = f"{len({r.group for r in self.rows})} groups, {total:,} parameters"
        if self.step is not None:
            title += f", at step {self.step}"
        return "\n".join([title, *lines])

    def __repr__(self) -> str:
        return str(self)


def _span(values: list[float | None], spelling: str) -> str:
    """One value, or the range of several (`0.000237..0.001`); `-` if unknown."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    low, high = spelling.format(min(known)), spelling.format(max(known))
    return low if low == high else f"{low}..{high}"


_INDEX = re.compile(r"\[(\d+)\]")


def _ranges(values: list[int]) -> str:
    values = sorted(set(values))
    parts, start, previous = [], values[0], values[0]
    for value in [*values[1:], None]:
        if value is not None and value == previous + 1:
            previous = value
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if value is not None:
            start = previous = value
    return ",".join(parts)


def collapse(paths: tuple[str, ...] | list[str]) -> list[str]:
    """Paths that differ only in their indices, as one: `blocks[0-23].norm.weight`."""
    by_template: dict[str, list[tuple[int, ...]]] = {}
    for path in paths:
        template = _INDEX.sub("[#]", path)
        by_template.setdefault(template, []).append(
            tuple(int(i) for i in _INDEX.findall(path))
        )
    out = []
    for template, indices in by_template.items():
        text = template
        for position in range(template.count("[#]")):
            text = text.replace(
                "[#]", f"[{_ranges([i[position] for i in indices])}]", 1
            )
        out.append(text)
    return out


def rows(opt: ParamGroups, state: ParamGroupsState) -> tuple[ReportRow, ...]:
    """The report's rows: `ParamGroups.rows`, with the rates at the state's step."""
    values = current_hyperparams(opt, state)
    out = []
    for row in opt.rows(state.assignment):
        rates = {
            name: values.get(f"{row.key}.{name}")
            for name in ("learning_rate", "weight_decay")
        }
        out.append(
            ReportRow(
                group=row.group,
                layer=row.layer,
                paths=row.paths,
                size=row.size,
                lr_mult=row.lr_mult,
                wd_mult=row.wd_mult,
                **{
                    name: None if value is None else float(np.asarray(value))
                    for name, value in rates.items()
                },
            )
        )
    return tuple(out)


@checked
def param_groups_report(
    opt: ParamGroups, state: ParamGroupsState, *, by_layer: bool = False
) -> GroupReport:
    """Who got what: the table of an `eqopt.param_groups` optimiser's groups; `print` it.

    Per group: the paths it took, collapsed where they repeat, the number of
    parameters, the multipliers, and the learning rate and weight decay in use
    at the state's step (with layer decay, their range over the group's
    layers). The step is the one its parts' states count, found as
    `eqopt.current_hyperparams` finds a schedule's (`None` where they differ,
    or a state holds several counts). Outside `jit`.

    **Arguments:**

    - `opt`: the `eqopt.ParamGroups` (inside a chain, the part itself).
    - `state`: its state, from `init` or `update`.
    - `by_layer`: with layer decay, one line per group and layer.

    **Returns:** an `eqopt.GroupReport`.
    """
    return GroupReport(
        rows=rows(opt, state), step=step_count(opt, state), by_layer=by_layer
    )
