"""Per-node figures as text: the table ``conveyor run`` and ``conveyor bench`` print (and whose
cells the HTML report shows), with sizes and shares written the one way everywhere."""

from __future__ import annotations

from typing import Any


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{round(100 * x)} %"


NODE_COLUMNS = ["node", "op", "runs", "items", "items/s", "busy", "wait", "queue", "item size"]


def node_cells(rows: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Per node, the cells of ``NODE_COLUMNS`` as text (the text table and the HTML report)."""
    lines = []
    for name, row in rows.items():
        p = row.get("perf") or {}
        q = p.get("queue")
        queue = "" if not q else (f"{q['mean']:.1f}/{q['capacity']}" if q.get("mean") is not None
                                  else f"-/{q['capacity']}")
        lines.append([name, row["op"], p.get("runs") or "", "-" if row.get("items") is None else str(row["items"]),
                      f"{p['items_per_s']:,.1f}" if p else "-", pct(p.get("busy")), pct(p.get("wait")),
                      queue, fmt_bytes(row.get("item_bytes"))])
    return lines


def node_table(rows: dict[str, dict[str, Any]], sizes: bool = True, notes: bool = False) -> str:
    """A fixed-width table: one row per node (``sizes``: with the measured item sizes;
    ``notes``: with what each node counts itself, a row's ``notes``)."""
    head, lines = list(NODE_COLUMNS), node_cells(rows)
    if not sizes:
        head, lines = head[:-1], [r[:-1] for r in lines]
    if notes:
        head.append("counts")
        lines = [r + [rows[name].get("notes") or ""] for r, name in zip(lines, rows)]
    widths = [max(len(h), *(len(r[i]) for r in lines)) if lines else len(h) for i, h in enumerate(head)]
    right = {3, 4, 5, 6, 7, 8}

    def fmt(cells: list[str]) -> str:
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(padded).rstrip()

    return "\n".join([fmt(head)] + [fmt(r) for r in lines])

