"""bench/side_by_side.py, the writer of bench/results/*.json, on hand-made inputs of both tools.

Every expected pairing and figure below is written out by hand from the script's documented rules
(CONFIGn -> MODEL1_CONFIGn, TP-hN -> TP_PAD64, same b; prefill by shape and s_kv).
"""
import importlib.util
import json
import os
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "side_by_side.py")


def load_script():
    spec = importlib.util.spec_from_file_location("side_by_side", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decode(label, b, us, tflops, h_q=64, s_q=2):
    return {"label": label, "b": b, "s_q": s_q, "h_q": h_q, "median_us": us, "tflops": tflops}


def prefill(label, s_kv, us, tflops, mode, pct, staging=0.0, h_q=64):
    return {"label": label, "s_q": 4096, "h_q": h_q, "s_kv": s_kv, "median_us": us, "tflops": tflops, "mode": mode,
            "pct_gemm_ceiling": pct, "staging_us": staging}


SMLA = {
    "device": "NVIDIA H200",
    "bf16_gemm_ceiling_tflops": 800.0,
    "results": [
        decode("CONFIG1", 2, 16.0, 20.0),
        decode("TP-h8", 64, 40.0, 50.0, h_q=8),
        decode("V3.2", 64, 180.0, 400.0, h_q=128),
        decode("SQ1-CONFIG2", 1, 18.0, 15.0, h_q=128, s_q=1),
        decode("MTP-h8", 64, 38.0, 52.0, h_q=8),
    ],
    "prefill": [
        prefill("PFD-V4-h64", 8192, 700.0, 480.0, "direct", 60.0, staging=20.0),
        prefill("PF-D512-h128", 32768, 3600.0, 600.0, "flat", 75.0, h_q=128),
        prefill("PF-V4-h64", 16384, 600.0, 500.0, "flat", 62.5),
    ],
}

PEER_CSV = """kind,case,b,s_kv,median_us,tflops
decode,MODEL1_CONFIG1,2,32768,18.0,17.8
decode,MODEL1_CONFIG1,64,32768,52.0,40.0
decode,TP_PAD64,64,32768,52.5,39.0
decode,V32,64,32768,188.0,388.0
decode,MODEL1_CONFIG2_SQ1,1,32768,19.5,14.0
prefill,PF_MODEL1_C1_h64_k512,1,8192,520.0,532.0
prefill,PF_MODEL1_C1_h64_k512,1,65536,594.0,463.0
prefill,PF_D512_h128_k2048,1,32768,3560.0,616.0
"""


@pytest.fixture
def document(tmp_path):
    script = load_script()
    peer_path = tmp_path / "peer.csv"
    peer_path.write_text(PEER_CSV)
    doc, name = script.result_document(SMLA, script.read_peer(str(peer_path)), "abc1234", "2026-12-03")
    return doc, name


def by_label(doc):
    return {c["label"]: c for c in doc["cases"]}


def test_file_name_and_required_fields(document):
    doc, name = document
    assert name == "2026-12-03-nvidia-h200-abc1234.json"
    assert (doc["card"], doc["commit"], doc["date"]) == ("NVIDIA H200", "abc1234", "2026-12-03")
    required = {"kind", "label", "b", "s_q", "h_q", "s_kv", "smla_us", "peer_us", "smla_tflops", "peer_tflops"}
    assert len(doc["cases"]) == 8
    for case in doc["cases"]:
        assert required <= set(case), case["label"]
    json.dumps(doc)  # what the script writes


def test_decode_cases_meet_their_peer_case_at_the_same_batch(document):
    cases = by_label(document[0])
    assert (cases["CONFIG1"]["peer_case"], cases["CONFIG1"]["peer_us"]) == ("MODEL1_CONFIG1", 18.0)  # b = 2, not 64
    assert (cases["TP-h8"]["peer_case"], cases["TP-h8"]["peer_us"]) == ("TP_PAD64", 52.5)
    assert (cases["V3.2"]["peer_case"], cases["V3.2"]["peer_tflops"]) == ("V32", 388.0)
    assert cases["SQ1-CONFIG2"]["peer_case"] == "MODEL1_CONFIG2_SQ1"
    assert cases["MTP-h8"]["peer_case"] is None and cases["MTP-h8"]["peer_us"] is None
    assert cases["CONFIG1"]["s_kv"] is None


def test_prefill_cases_carry_both_shares_of_the_ceiling_and_the_two_pass_cost(document):
    cases = by_label(document[0])
    direct = cases["PFD-V4-h64"]
    assert (direct["peer_case"], direct["peer_us"]) == ("PF_MODEL1_C1_h64_k512", 520.0)  # s_kv 8192, not 65536
    assert direct["pct_gemm_ceiling"] == 60.0
    assert direct["peer_pct_gemm_ceiling"] == pytest.approx(66.5)  # 532 of 800 TFLOPS
    assert (direct["staging_us"], direct["peer_two_pass_us"]) == (20.0, 540.0)
    flat = cases["PF-D512-h128"]
    assert flat["peer_pct_gemm_ceiling"] == pytest.approx(77.0)  # 616 of 800
    assert "peer_two_pass_us" not in flat and "staging_us" not in flat
    unmatched = cases["PF-V4-h64"]  # no peer row at s_kv 16384
    assert unmatched["peer_us"] is None and unmatched["peer_pct_gemm_ceiling"] is None


def test_direct_v4_case_meets_the_peer_case_of_as_many_keys_where_there_is_one(tmp_path):
    # PFD-V4-h64 attends 128 window keys + 512 compressed ones: 640 a token.
    script = load_script()
    peer_path = tmp_path / "peer.csv"
    peer_path.write_text(PEER_CSV + "prefill,PF_MODEL1_C1_h64_k640,1,8192,650.0,535.0\n")
    doc, _ = script.result_document(SMLA, script.read_peer(str(peer_path)), "abc1234", "2026-12-03")
    direct = by_label(doc)["PFD-V4-h64"]
    assert (direct["peer_case"], direct["peer_us"]) == ("PF_MODEL1_C1_h64_k640", 650.0)
    assert direct["peer_two_pass_us"] == 670.0  # staging 20 + 650
    assert by_label(doc)["PF-V4-h64"]["peer_us"] is None  # flat cases keep their k512 match (none at 16384)


def test_summary_line_names_ratio_ceiling_and_two_pass(document):
    script = load_script()
    line = script.summary_line(by_label(document[0])["PFD-V4-h64"])
    assert "0.74x" in line  # 520 / 700
    assert "gemm ceiling 60% vs 66%" in line or "gemm ceiling 60% vs 67%" in line
    assert "two-pass     540.0 us (staging 20.0) 0.77x" in line
    assert script.summary_line(by_label(document[0])["MTP-h8"]).endswith(" -")


def test_main_writes_the_file(tmp_path, monkeypatch, capsys):
    script = load_script()
    smla_path = tmp_path / "gpu_bench.json"
    smla_path.write_text(json.dumps(SMLA))
    peer_path = tmp_path / "peer.csv"
    peer_path.write_text(PEER_CSV)
    out = tmp_path / "results"
    monkeypatch.setattr(sys, "argv", ["side_by_side.py", "--smla", str(smla_path), "--peer", str(peer_path),
                                      "--commit", "abc1234", "--date", "2026-12-03", "--out", str(out)])
    script.main()
    written = json.loads((out / "2026-12-03-nvidia-h200-abc1234.json").read_text())
    assert by_label(written)["TP-h8"]["peer_us"] == 52.5
    assert str(out / "2026-12-03-nvidia-h200-abc1234.json") in capsys.readouterr().out


def load_peer_same_keys():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "peer_same_keys.py")
    spec = importlib.util.spec_from_file_location("peer_same_keys", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peer_same_keys_adds_the_two_cases_once(tmp_path, monkeypatch):
    script = load_peer_same_keys()
    harness = tmp_path / "bench_flashmla.cu"
    v4_h128 = '    for (int s : {8192}) v.push_back({"PF_MODEL1_C2_h128_k1024", 4096, 128, 512, 1024, s});\n'
    harness.write_text("std::vector<PrefillSpec> v;\n" + v4_h128 + "return v;\n")
    monkeypatch.setattr(sys, "argv", ["peer_same_keys.py", str(harness)])
    assert script.main() == 0
    text = harness.read_text()
    assert text.index(v4_h128) < text.index('"PF_MODEL1_C1_h64_k640", 4096, 64, 512, 640, s}')
    assert '"PF_MODEL1_C2_h128_k1152", 4096, 128, 512, 1152, s}' in text
    assert script.main() == 0 and harness.read_text() == text  # a second run changes nothing


def test_peer_same_keys_leaves_an_unexpected_harness_alone(tmp_path, monkeypatch):
    script = load_peer_same_keys()
    harness = tmp_path / "bench_flashmla.cu"
    harness.write_text("no case list here\n")
    monkeypatch.setattr(sys, "argv", ["peer_same_keys.py", str(harness)])
    assert script.main() == 1
    assert harness.read_text() == "no case list here\n"
