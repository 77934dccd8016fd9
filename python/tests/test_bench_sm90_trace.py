"""bench/cuda/sm90_trace.py, the reader of the sm90 kernels' trace tables, on a hand-made log.

The expected figures are worked out by hand at a 1000 MHz clock (1000 cycles = 1 us).
"""
import importlib.util
import os
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "cuda", "sm90_trace.py")


def load_script():
    spec = importlib.util.spec_from_file_location("sm90_trace", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trace_line(cta, start_ns, deltas):
    return f"sm90trace cta {cta} 0 0 sm {cta} t0 {start_ns} cycles " + " ".join(str(d) for d in deltas)


def waits_line(cta, values):
    names = ["producer_free", "producer_rows", "score_full", "score_p_empty", "value_full", "value_p_full",
             "producer_index"]
    return f"sm90waits cta {cta} 0 0 " + " ".join(f"{n} {v}" for n, v in zip(names, values))


def write_log(tmp_path, lines):
    path = tmp_path / "trace.log"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_waits_attach_to_the_cta_line_before(tmp_path):
    trace = load_script()
    log = write_log(tmp_path, [
        "=== CONFIG1 b=128",
        "device line that is not a table row",
        trace_line(0, 1000, range(1, 17)),
        waits_line(0, [1, 2, 3, 4, 5, 6, 7]),
        trace_line(1, 2000, range(2, 18)),  # an older log's CTA without a waits line
    ])
    runs = trace.parse(log)
    assert list(runs) == ["CONFIG1 b=128"]
    rows = runs["CONFIG1 b=128"]["trace"]
    assert [r[0] for r in rows] == [1000, 2000]
    assert rows[0][1] == list(range(1, 17))
    assert rows[0][2] == {"producer_free": 1, "producer_rows": 2, "score_full": 3, "score_p_empty": 4,
                          "value_full": 5, "value_p_full": 6, "producer_index": 7}
    assert rows[1][2] == {}


def test_waits_summary_is_median_min_max_of_the_last_launch(tmp_path, monkeypatch, capsys):
    trace = load_script()
    lines = ["=== case"]
    # A first launch, long before (more than the launch gap): not summarized.
    lines += [trace_line(9, 0, [1000] * 16), waits_line(9, [99000] * 7)]
    # The last launch: three CTAs whose score_full waits are 1000, 2000 and 6000 cycles.
    for cta, (start, score_full) in enumerate([(10**9, 1000), (10**9 + 500, 2000), (10**9 + 900, 6000)]):
        lines += [trace_line(cta, start, [(e + 1) * 1000 for e in range(16)]),
                  waits_line(cta, [0, 0, score_full, 0, 0, 0, 0])]
    monkeypatch.setattr(sys, "argv", ["sm90_trace.py", write_log(tmp_path, lines), "--clock-mhz", "1000"])
    trace.main()
    out = capsys.readouterr().out
    assert "case: FP8 kernel, 3 CTAs of the last launch" in out
    score = [line.split() for line in out.splitlines() if line.strip().startswith("score_full")]
    assert score == [["score_full", "2.00", "1.00", "6.00"]]
    barriers = [line.split() for line in out.splitlines() if line.strip().startswith("barriers")]
    assert barriers == [["barriers", "1.00", "1.00", "1.00"]]


def test_a_log_without_waits_prints_no_waits_block(tmp_path, monkeypatch, capsys):
    trace = load_script()
    log = write_log(tmp_path, ["=== old", trace_line(0, 5, [2000] * 16)])
    monkeypatch.setattr(sys, "argv", ["sm90_trace.py", log, "--clock-mhz", "1000"])
    trace.main()
    out = capsys.readouterr().out
    assert "old: FP8 kernel, 1 CTAs" in out
    assert "waits over the tiles" not in out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
