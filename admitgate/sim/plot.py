"""Plots of simulated runs (needs matplotlib: ``pip install 'admitgate[plot]'``)."""

from __future__ import annotations

from typing import Any

from ..core.errors import ConfigError

_LINES = (
    ("edge", "herd arrivals at the edge", "-"),
    ("admitted", "forwarded to the upstream", "-"),
    ("served", "served (2xx)", "-."),
    ("capacity", "capacity μ", "--"),
    ("headroom", "gate's H = rate − λ_new", ":"),
)


def plot(runs: list[dict[str, Any]], path: str) -> None:
    """Save a PNG: per run, herd arrivals at the edge, admissions, capacity μ and the gate's H per second.

    Needs matplotlib (``pip install 'admitgate[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plot", "needs matplotlib: pip install 'admitgate[plot]'") from None
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 4.2), sharey=True, squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        series = run["series"]
        for name, label, style in _LINES:
            points = sorted((int(k), v) for k, v in series.get(name, {}).items() if int(k) >= -1)
            if points:
                ax.step([p[0] for p in points], [p[1] for p in points], style, where="post", label=label)
        bound = f"∫H dt = M at {run['bound_integral_s']} s" if "bound_integral_s" in run else f"M/H {run['bound_s']} s"
        figures = f"drain {run['drain_s']} s ({bound}), 5xx {run['server_5xx']}"
        ax.set_title(f"{run['scenario']}: gate = {run['gate']}\n{figures}", fontsize=9)
        ax.set_xlabel("seconds since the release")
        ax.set_yscale("symlog", linthresh=100)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("requests per second")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
