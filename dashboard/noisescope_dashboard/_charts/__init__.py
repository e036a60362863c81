"""Chart builders: pure functions from small frames (made by ``_frames``) to Altair charts.

They never touch Streamlit or the API, so tests check them through ``chart.to_dict()`` (which
validates against the Vega-Lite schema). Titles live outside the charts (the pages put them in
``st.subheader``, where they wrap instead of being clipped); each chart carries its title as
its Vega-Lite ``description`` (read by screen readers and by the tests). Log axes are ticked at
1-2-5 × 10^k or at powers of ten, labelled without exponents.

- ``_run``: the Run page (B_simple and its band, one quantity, B_simple per layer);
- ``_comparison``: the Compare pages (B_simple of several runs);
- ``_critical``: the critical batch size (S-E plane, B_crit against loss, across tasks);
- ``_what_if``: the What-if page (time against compute, speed-up);
- ``_axes``: what they share (formats, log ticks, scales, legends, sizes).
"""

from __future__ import annotations

from noisescope_dashboard._charts._axes import AXIS_FORMAT, XAxis, log_ticks, palette_colours
from noisescope_dashboard._charts._comparison import band_chart, compare_chart
from noisescope_dashboard._charts._critical import (
    b_simple_vs_b_crit_chart,
    bcrit_vs_loss_chart,
    sweep_chart,
)
from noisescope_dashboard._charts._run import b_simple_chart, layers_chart, metric_chart
from noisescope_dashboard._charts._what_if import speedup_chart, tradeoff_chart

__all__ = [
    "AXIS_FORMAT",
    "XAxis",
    "b_simple_chart",
    "b_simple_vs_b_crit_chart",
    "band_chart",
    "bcrit_vs_loss_chart",
    "compare_chart",
    "layers_chart",
    "log_ticks",
    "metric_chart",
    "palette_colours",
    "speedup_chart",
    "sweep_chart",
    "tradeoff_chart",
]
