"""Lightning DDP on 2 CPU processes (gloo) with the noisescope callback; run as a script.

``python _lightning_ddp.py SERVER_URL OUT_JSON``: Lightning's ``ddp`` strategy re-launches this
script for rank 1. Rank 0 writes its run id and the |G_big|^2 its module read before clipping.
"""

from __future__ import annotations

from tests.integrations._lit import DigitsMLP, fit_on_two_ranks


def main() -> None:
    fit_on_two_ranks(DigitsMLP, task="digits-ddp", strategy="ddp", gradient_clip_val=0.01)


if __name__ == "__main__":
    main()
