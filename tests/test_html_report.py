"""qbench report --html: one self-contained page (no script, no external file), checked in a real headless
browser (Debian's chromium): it loads without console errors, the summary's numbers are in the rendered DOM,
and its screenshot is not blank. Skipped only where no chromium is installed (.ci/run installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import timed_record, write_run

from qbench.analysis import html_report
from qbench.analysis.compare import load_any
from qbench.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0"]
CONSOLE = re.compile(r":CONSOLE[:(]")  # how chromium logs a page's console message on stderr


def runs(tmp_path: Path) -> list[str]:
    """Two runs of two commits: the page then has a comparison and a history."""
    out = []
    for i, scale in enumerate((1.0, 1.4)):
        recs = [timed_record({"m": m, "dtype": "fp16"}, [scale * m / 8 * x for x in (0.9, 1.0, 1.1, 1.05, 0.95)],
) for m in (8, 16)]
        out.append(str(write_run(tmp_path / f"run{i}", recs, git_commit=f"{i + 1:x}" * 40,
                                 time_utc=f"2026-11-2{i}T00:00:00+00:00")))
    return out


def browse(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120)


def test_the_page_is_self_contained_and_holds_the_summary_numbers(tmp_path):
    page = html_report.page([load_any(p) for p in runs(tmp_path)], ["time"])
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r"""(src|href)=["'](https?:|//)""", page) and "url(http" not in page
    for section in ("Environment", "Summary", "Figures", "Comparison", "History"):
        assert f"<h2>{section}</h2>" in page
    # m=8: run1's samples 1.4 x (0.9 .. 1.1) ms: median 1.4, p20 1.316, p80 1.484; run0's 1 x the same
    assert ">1.400 [1.316, 1.484]<" in page and ">1.000 [0.9400, 1.060]<" in page


def test_one_run_has_no_comparison_and_the_command_writes_the_file(tmp_path):
    out = tmp_path / "report.html"
    with pytest.raises(SystemExit) as exc:
        main(["report", runs(tmp_path)[0], "--html", str(out)])
    assert exc.value.code == 0
    text = out.read_text()
    assert "<h2>Summary</h2>" in text and "<h2>Comparison</h2>" not in text
    assert "no standard figure for toy" in text  # a bench without panels is named, not a crash


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")
def test_chromium_console_check_catches_an_error(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('broken page')</script></body></html>")
    assert CONSOLE.search(browse(bad, tmp_path, "--dump-dom").stderr)  # the check below can fail


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")
def test_report_in_headless_chromium(tmp_path):
    page = tmp_path / "report.html"
    with pytest.raises(SystemExit) as exc:
        main(["report", *runs(tmp_path), "--metric", "time", "--html", str(page)])
    assert exc.value.code == 0
    dom = browse(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0
    assert not [line for line in dom.stderr.splitlines() if CONSOLE.search(line)]
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", dom.stdout)
    assert "1.400 [1.316, 1.484]" in cells and "1.000 [0.9400, 1.060]" in cells  # medians [p20, p80] of samples
    shot = tmp_path / "shot.png"
    browse(page, tmp_path, f"--screenshot={shot}", "--window-size=1200,1600")
    from PIL import Image, ImageStat

    image = Image.open(shot).convert("L")
    assert image.size == (1200, 1600)
    assert ImageStat.Stat(image).stddev[0] > 10  # a blank page is one grey level


COMMITTED = Path(__file__).resolve().parent.parent / "results" / "switchback-h200-modes-c4c2232" / "run1"


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="the committed switchback run is gone")
def test_a_committed_run_gets_its_standard_figure_inline():
    page = html_report.page([load_any(COMMITTED)], ["kernels_ms"])
    assert page.count("<svg") == 1 and "NVIDIA H200" in page and "60eecf790f67caa07667de55bff4968189c71c92" in page


def test_runs_of_two_benches_get_a_page_that_says_what_they_lack(tmp_path):
    from qbench import store, units

    a = write_run(tmp_path / "a", [timed_record({"m": 8}, [1.0, 1.1])])
    b = write_run(tmp_path / "b", [store.make_record("other", {"k": 1}, {"t": 2.0}, units={"t": units.MS},
                                                     samples={"t": [2.0, 2.1]})])
    page = html_report.page([load_any(a), load_any(b)], ["time"])
    assert "<h3>other: " in page and "nothing to show: --metric time" in page
    assert "<h2>Comparison</h2><p class=\"legend\">none: " in page
