"""What a recorded agent session's analysis must get right, against what the driver did (the truth
the recording does not carry): shared by the live test (a fresh recording through the proxy) and the
golden test (the recording from the reference llama-server kept in tests/golden/agent/)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path


def slotlab(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """The `slotlab` command a user runs (this interpreter's)."""
    return subprocess.run([sys.executable, "-m", "slotlab.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def analyse(session: Path) -> tuple[dict, str, str]:
    """`slotlab simulate SESSION --why` as a user runs it, no flags given (they come from the log's
    header): (its JSON, its text, its stderr)."""
    j = slotlab("simulate", str(session), "--why", "--json")
    assert j.returncode == 0, j.stderr[-3000:]
    t = slotlab("simulate", str(session), "--why")
    assert t.returncode == 0, t.stderr[-3000:]
    return json.loads(j.stdout), t.stdout, j.stderr


def tools_render(session: Path) -> bool:
    """Whether the model's chat template renders the tools at all (Gemma 3's does not: then a tools
    change costs nothing and must not be reported)."""
    from slotlab.conversation import Renderer
    from slotlab.llama.model import default_model_path

    from tests.agent.scenario import TOOLS

    r = Renderer.of(str(default_model_path()))
    m = [{"role": "user", "content": "hi"}]
    return list(r.tokens(m, TOOLS)) != list(r.tokens(m, None))


def check(doc: dict, text: str, stderr: str, truth: list[dict], *, tools_visible: bool) -> dict:
    """Assert the analysis (module docstring); returns per kind the tokens the changes cost."""
    assert "the server's flags from the session log: -c 8192 -np 2 --cache-ram 256" in stderr, stderr[-2000:]
    calls = doc["stable"]["calls"]
    assert len(calls) == len(truth), (len(calls), len(truth))
    assert all(r["status"] == 200 for r in doc["results"])

    # the conversations: exactly the driver's, though none sends a session id but one
    found, want = defaultdict(list), defaultdict(list)
    for i, (c, t) in enumerate(zip(calls, truth)):
        found[c["conversation"]].append(i)
        want[t["conversation"]].append(i)
    assert sorted(found.values()) == sorted(want.values()), (dict(found), dict(want))

    # every change named at its call (kind, message index), priced; no change on a plain turn
    changes = {c["request"]: c for c in doc["client_changes"]}
    cost: dict[str, int] = defaultdict(int)
    for i, t in enumerate(truth):
        kind = t["change"]
        if kind is None:
            assert i not in changes, (i, t, changes.get(i))
            continue
        assert i in changes, (i, t)
        ch = changes[i]
        assert (ch["change"], ch["message"]) == (kind, t["message"]), (i, t, ch)
        assert ch["stable"] is not None, ch  # priced against a stable client
        assert calls[i]["client"] == ch["stable"]
        assert f"#{i} client change in conversation" in text
        if kind == "tools_changed" and not tools_visible:  # the template does not render tools: free
            assert ch["tokens_lost"] == 0 and ch["stable"] == 0, ch
        cost[kind] += ch["stable"]
    assert set(changes) <= {i for i, t in enumerate(truth) if t["change"]}

    # the clock: every turn after the first re-processes what the server held; a stable client keeps it
    clock = [i for i, t in enumerate(truth) if t["conversation"] == "clock" and t["change"]]
    for i in clock:
        assert changes[i]["tokens_lost"] > 1000 and calls[i]["client"] > 1000, (i, changes[i], calls[i])
    st = doc["stable"]
    assert st["processed"] == doc["totals"]["tokens_prefilled"]
    assert st["saved"] == st["processed"] - st["stable_processed"] >= sum(calls[i]["client"] for i in clock) - 100

    # only advice that worked: every advised change saved tokens over the whole session, nothing untested
    assert "untested" not in text
    adv = doc["advice"]
    for t in adv["flags"]:
        assert t["advice"] == (t["saved"] > 0 and not t["refuted"]), t
        shown = f"advice (server): {' '.join(t['flags'])} — saves {t['saved']} tokens"
        assert (shown in text) == t["advice"], (t, shown)
    for t in adv["client"]:
        if t["works"]:
            assert f"advice (client): {t['advice']} — saves {t['saved']} tokens" in text, t
        else:
            assert f"tried, not advice: undoing {t['change']}" in text, t
    # should the user upgrade: each newer build's rules run over the session, said as a number
    assert [b["build"] for b in adv["builds"]] == [b for b in (11434, 11549) if b > adv["build"]]
    for b in adv["builds"]:
        assert b["saved"] == doc["totals"]["tokens_prefilled"] - b["processed"], b
        word = "the same tokens as" if b["saved"] == 0 else "fewer" if b["saved"] > 0 else "more"
        assert f"upgrade: on this session b{b['build']} would prefill" in text and word in text, b
    sysfix = [t for t in adv["client"] if t["change"] == "system_changed"]
    assert sysfix and sysfix[0]["saved"] > 5000, adv["client"]
    for m in doc["misses"]:  # a miss's flag advice is a tested one that reused more at that call
        for f in m["saved"]:
            assert any(" ".join(t["flags"]) == f and t["advice"] for t in adv["flags"]), (m, f)
            assert m["saved"][f] > 0
    return dict(cost)


def confirm_advice(session: Path, doc: dict) -> None:
    """Each advised flag change, run on its own (`slotlab simulate SESSION FLAG`): it processes exactly
    the tokens the analysis said."""
    base = doc["totals"]["tokens_prefilled"]
    for t in doc["advice"]["flags"]:
        if not t["advice"]:
            continue
        r = slotlab("simulate", str(session), "--json", *doc["flags"], *t["flags"])
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads(r.stdout)["totals"]["tokens_prefilled"] == base - t["saved"], t
