"""`make lab` really starts JupyterLab on the course index (headless, loopback, free port)."""

from __future__ import annotations

import pytest
from lab_server import get_json, get_status, jupyter_lab


@pytest.mark.slow
def test_make_lab_serves_the_course_index():
    with jupyter_lab() as (base, token):
        model = get_json(f"{base}/api/contents/notebooks/00_welcome.ipynb?token={token}")
        assert model["type"] == "notebook"
        sources = "".join(cell["source"] for cell in model["content"]["cells"])
        assert "Set-up check" in sources
        assert get_status(f"{base}/lab/tree/notebooks/00_welcome.ipynb?token={token}") == 200
        assert get_status(f"{base}/api/contents/notebooks?token=wrong") == 403
