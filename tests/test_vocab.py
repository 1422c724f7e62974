"""Training sized to the data (issue 46): the draft vocabulary from the dataset's distinct answer tokens
(specops/vocab.py), said in one line; a training past a few hours warned of (estimate.too_long)."""

import io
import json
import pickle
import zipfile

import pytest

from specops import estimate, vocab
from specops.config import load_config
from specops.errors import SpecopsError


def token_freq(counts: dict) -> bytes:
    """A token_freq.pt as torch.save writes a dict of ints (a zip holding ARCHIVE/data.pkl)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("token_freq/data.pkl", pickle.dumps(counts, protocol=2))
        z.writestr("token_freq/version", "3\n")
    return buf.getvalue()


def test_distinct_tokens_of_a_token_freq_file():
    assert vocab.distinct_tokens(token_freq({i: 3 for i in range(4262)})) == 4262
    assert vocab.distinct_tokens(None) is None and vocab.distinct_tokens(b"not a zip") is None
    # anything but a plain dict of counts (a class to import: a tensor, code) is refused, never loaded
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("x/data.pkl", pickle.dumps(zipfile.ZipInfo("a")))
    assert vocab.distinct_tokens(evil.getvalue()) is None


def test_auto_sizes_the_draft_vocabulary_to_the_data():
    """On SmolLM2 answers holding 4,262 distinct tokens, 32,000 (configs/eagle3.yaml's old figure) trained
    4-12x slower than 4,096 on a CPU: auto takes the distinct tokens, rounded up to 64, capped."""
    n, line = vocab.choose("auto", 4262, 49152, "draft-vocab-size auto in configs/eagle3.yaml")
    assert n == 4288
    assert line == ("draft vocabulary: 4,288 tokens (auto: the data holds 4,262 distinct answer tokens, rounded up "
                    "to 64, at most 32,000; draft-vocab-size auto in configs/eagle3.yaml; a number there or "
                    "--draft-vocab-size N sets it)")
    assert vocab.choose("auto", 90000, 151000, "x")[0] == 32000  # (the cap)
    assert vocab.choose("auto", 100, 128, "x")[0] == 128  # (never past the verifier's vocabulary)
    assert vocab.choose("auto", None, 1024, "x")[0] == 1024  # (no counts: the cap, within the verifier's)
    n, line = vocab.choose(32000, 4262, 49152, "draft-vocab-size 32000 in my.yaml")
    assert n == 32000 and "the data holds 4,262 distinct answer tokens: `--draft-vocab-size auto`" in line
    assert vocab.choose(128, 100, 1024, "configs/demo.yaml") == (128, "draft vocabulary: 128 tokens "
                                                                       "(configs/demo.yaml)")
    assert vocab.choose(None, 10, 1024, "my.yaml")[0] is None


def test_the_default_config_is_auto_and_the_flag_overrides_it():
    assert load_config(None, "cpu", {})["flags"]["draft-vocab-size"] == "auto"
    assert load_config(None, "cpu", {"draft-vocab-size": "4096"})["flags"]["draft-vocab-size"] == 4096
    with pytest.raises(SpecopsError, match=r"--draft-vocab-size 'many': .* or auto"):
        load_config(None, "cpu", {"draft-vocab-size": "many"})


def test_a_training_past_a_few_hours_is_said_with_what_shortens_it():
    """305 rows at 75 tokens/s on a CPU took about 50 minutes; ten times the rows would take hours."""
    assert estimate.too_long(3000, 75.0, epochs=3, draft_vocab=32000) is None
    line = estimate.too_long(30000, 75.0, epochs=3, draft_vocab=32000, basis="measured on 32 row(s)")
    assert line == ("the training takes about 8.3 h at 75 tokens/s (measured on 32 row(s), 3 epoch(s)): a draft "
                    "vocabulary sized to the data (--draft-vocab-size auto; now 32000), fewer epochs (--epochs), "
                    "shorter rows (--seq-length) or fewer rows shorten it")
    assert "draft vocabulary" not in estimate.too_long(30000, 75.0, epochs=3, draft_vocab="auto")


def test_train_says_the_draft_vocabulary_once_as_auto_when_auto_hidden_states_train_offline():
    """`inv train` (hidden states auto, the host's plan: offline) said the line twice, the second without auto
    (`draft vocabulary: 4,288 tokens (draft-vocab-size 4288 in ...)`): sized and said once, as auto."""
    from fakes import RecordingTransport
    from specops import inventory, paths
    from specops.contract import BEGIN, END
    from specops.ops import train

    def framed(payload: dict) -> str:
        return f"{BEGIN}{json.dumps(payload)}{END}\n"

    h = inventory.Host(name="h", transport="local", profile="cpu", venv="/opt/env", workdir="/w")
    inspected = {"ok": True, "format": "safetensors", "files": 2, "rows": 2, "verifier_vocab_size": 49152,
                 "verifier_config": "/m/v/config.json", "record": {"layer_ids": [2, 15, 27, 29], "verifier": "/m/v"}}
    for mode in ("auto", "offline"):
        t = RecordingTransport(h, answers=[
            (r"specops_host\.train\.online", 0, framed({"ok": True, "mode": "offline", "reason": "the files are there",
                                                        "prepared": True, "missing": 0})),
            (r"specops_host\.data\.inspect_data", 0, framed(inspected))],
            files={"/w/data/d/token_freq.pt": token_freq({i: 2 for i in range(4262)})})
        spec = train.make_spec(t, config=None, rid="r1", dataset="d", verifier="/m/v", nproc=None, overrides={},
                               hidden_states=mode)
        said = [n.text for n in t.notes if n.text.startswith("draft vocabulary")]
        assert said == ["draft vocabulary: 4,288 tokens (auto: the data holds 4,262 distinct answer tokens, rounded "
                        f"up to 64, at most 32,000; draft-vocab-size auto in {paths.REPO}/configs/eagle3.yaml; a number there or "
                        "--draft-vocab-size N sets it)"], (mode, said)
        assert spec.flags["draft-vocab-size"] == 4288 and spec.hidden_states == "offline"
