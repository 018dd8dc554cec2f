"""bench/throughput/colour_head.py: each configuration builds the head it names (channels and colour-network
parameters counted by hand) and the result carries its meta block."""
import json

from bench.throughput import colour_head


def test_runner_builds_the_heads_it_names(tmp_path):
    out = tmp_path / "colour_head.json"
    assert colour_head.main(["--points", "64", "--repeats", "1", "--threads", "1", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    rows = {r["config"]: r for r in d["rows"]}
    # sh: 3 (degree + 1)^2 coefficients a vertex, no network
    assert (rows["sh head, degree 1"]["feature_channels"], rows["sh head, degree 1"]["colour_net_params"]) == (12, 0)
    assert (rows["sh head, degree 2"]["feature_channels"], rows["sh head, degree 2"]["colour_net_params"]) == (27, 0)
    # mlp, 12 features, width 64: (12 + direction) x 64 + 64, 64 x 64 + 64, 64 x 3 + 3;
    # the direction: 3 (2 x 4 + 1) = 27 frequency values, or (2 + 1)^2 = 9 SH values
    hidden = 64 * 64 + 64 + 64 * 3 + 3
    assert rows["mlp head, frequency directions (L=4)"]["colour_net_params"] == (12 + 27) * 64 + 64 + hidden
    assert rows["mlp head, sh directions (degree 2)"]["colour_net_params"] == (12 + 9) * 64 + 64 + hidden
    assert all(len(r["ms"]) == 1 and r["ms_median"] > 0 for r in d["rows"])
    assert d["meta"]["command"] and "git_commit" in d["meta"] and d["points"] == 64
