"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
FIXTURES = REPO / "fixtures"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs the real traces at {SHARED_DATA} (../shared/data, outside the package)")
    return SHARED_DATA


@pytest.fixture
def world1(tmp_path):
    """A one-rank gloo process group for the test (torch imported here: tests without torch skip
    before they ask for it)."""
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="session", autouse=True)
def _native_logger_kernel(request):
    """Build the logger's compiled dispatcher kernel once, before the first torch test, where a
    compiler is present (its first build takes 20-60 s; a rank spawned by a test with a timeout
    must find it built). Without one the logger's Python kernels are used and tested."""
    if any(item.get_closest_marker("torch") for item in request.session.items):
        try:
            import holmes.logger

            pytest.importorskip("torch")
            holmes.logger.build_native()
        except (ImportError, pytest.skip.Exception):
            pass
        except Exception:  # noqa: BLE001 - no compiler: the Python kernels are what is tested
            pass
    yield
