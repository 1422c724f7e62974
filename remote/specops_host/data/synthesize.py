"""Conversations the verifier writes itself (Magpie's method, arXiv 2406.08464): its chat template
rendered up to where a user's words begin (the pre-query template) is all the verifier is given;
what it writes there is a question, which it then answers through its chat template. One managed
vLLM server of the verifier serves both (the same launch code as extraction and regeneration),
many requests in flight.

Launch (`inv synthesize`'s, from the host workdir; `--plan` first, then the same without it as a detached job):
    <venv>/bin/python3 -m specops_host.data.synthesize --out synthesized/NAME.jsonl --verifier /models/V \
        --kind cuda --rows 1000 [--seed 0] [--topics FILE | --seed-prompts FILE] [--question-temperature 1.0|config] \
        [--answer-temperature 0|config] [--question-tokens 128] [--max-tokens 1024] [--concurrency 32] \
        [--attempts N] [--max-model-len N] [--tensor-parallel 8] [--trust-remote-code auto|true|false] \
        [--vllm-arg=ARG ...] [--overwrite] [--plan [--topics-later] [--seed-prompts-later]] [--result R]

Candidate i's requests carry the seed derived from (--seed, i), and rows are kept in candidate order,
so the same seed gives the same rows where vLLM's sampling is reproducible (a batch's numerics may
still differ on some kernels). With --topics (one a line), candidate i's question is steered by a
system turn naming topic i mod n (in the pre-query template only: the answer sees the question
alone). With --seed-prompts (JSONL rows as `inv evaluate --prompts` reads them, a conversations
row's first user turn, or plain text a line), the system turn shows prompt i mod n and asks for a
new question of its kind; the row carries the seed's line and category (a seed's copy: a duplicate).

Dropped, and counted: a question or answer cut at its token cap, empty, looping (repeated n-grams),
a refusal (the answer), a duplicate (the question, case and spacing aside), a failed request.
Candidates go --concurrency at a time, each as soon as one ends (its question, then its answer),
until --rows are kept or --attempts (default 4 x rows + 16) are spent (the shortfall then said).

Output: a JSONL row a conversation, as `inv prepare-data` takes it (+ "topic" with --topics; "seed_line",
"category" with --seed-prompts), written whole (a temp file, renamed) or not at all (--overwrite to replace):
    {"id": "synth-0-17", "conversations": [{"role": "user", "content": "..."}, {"role": "assistant", ...}]}
Meanwhile each candidate judged is appended to synthesized/.NAME.jsonl.partial (data/synth_progress.py); run again
with the same --out (and the same settings: refused otherwise) it resumes there, --overwrite starts over.
"""

import argparse
import contextlib
import json
import math
import os
import queue
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specops_host import contract
from specops_host.contract import Refused, emit
from specops_host.data import answers, synth_progress
from specops_host.data.answers import clock
from specops_host.data.synth_filters import judge_answer, judge_question, seed_of
from specops_host.data.synth_progress import DROPS, normal
from specops_host.datafmt import utf8_lines, verifier_config
from specops_host.jobs.records import job_state
from specops_host.serve import categories, speedup, vllm_server

PORT = "<port>"
MARK = "SPECOPSUSERTURN7F3A"  # (no spaces: templates `| trim` a turn's content)
TOPIC = "The user asks about {topic}."
SEED = "The user asks a new question of the same kind as this one, on another subject: {prompt}"
# -- sampling ------------------------------------------------------------------------------------

def sampling(flag, setting, model, what):
    """(request params, one line saying them) for --question-temperature / --answer-temperature:
    a temperature (0: greedy), or `config`: the verifier's generation_config.json read as regenerate reads it
    (answers.choose_sampling: greedy where it sets no sampling or do_sample false, which questions refuse)."""
    if str(setting).lower() == "config":
        params, _ = answers.choose_sampling(model)
        if not params.get("temperature"):
            if what == "questions":
                raise Refused(f"{flag} config: the verifier's generation config ({model}/generation_config.json) "
                              f"samples nothing (no temperature, or do_sample false), and greedy questions are all "
                              f"one: give a temperature, e.g. {flag} 1.0 (Magpie's)")
            return {"temperature": 0.0}, f"{what}: greedy (the verifier's generation config sets no sampling)"
        shown = ", ".join(f"{k} {v}" for k, v in params.items())
        return params, f"{what}: the verifier's generation config ({shown})"
    try:
        t = float(setting)
    except ValueError:
        t = -1.0
    if not (math.isfinite(t) and 0 <= t <= 5):
        raise Refused(f"{flag} {setting}: give a temperature from 0 (greedy) to 5, or config (the verifier's "
                      f"generation config)")
    if t == 0:
        if what == "questions":
            raise Refused(f"{flag} 0: greedy questions are all one (a pre-query template has one greedy "
                          f"continuation): give a temperature, e.g. {flag} 1.0 (Magpie's)")
        return {"temperature": 0.0}, f"{what}: greedy (temperature 0)"
    return {"temperature": t, "top_p": 1.0}, f"{what}: temperature {t:g}, top_p 1" + (
        " (Magpie's)" if what == "questions" and t == 1 else "")


# -- the plan --------------------------------------------------------------------------------------

def chat_template(model):
    """Where the verifier's chat template is (None: it has none)."""
    d = Path(model)
    for name in ("chat_template.jinja", "chat_template.json"):
        if (d / name).is_file():
            return name
    try:
        tc = json.loads((d / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    return "tokenizer_config.json" if isinstance(tc, dict) and tc.get("chat_template") else None


def read_topics(path):
    p = Path(path)
    if not p.is_file():
        raise Refused(f"--topics {path}: no such file on this host")
    topics = [ln.strip() for ln in p.read_text(errors="replace").splitlines() if ln.strip()]
    if not topics:
        raise Refused(f"--topics {path}: no topic in it: give one topic a line")
    return topics


def read_seed_prompts(path):
    """[{"prompt": text, "line": n, "category"?}] of a --seed-prompts file: JSONL rows as evaluate's --prompts
    (a "prompt" or "text", MT-Bench's "turns", any "category") or a conversations row (its first user turn);
    plain text where the first line is not a JSON object, one prompt a line. Refused naming the file and line."""
    p, where = Path(path), f"--seed-prompts {path}"
    if not p.is_file():
        raise Refused(f"{where}: no such file on this host")
    lines = [(n, x.strip()) for n, x in utf8_lines(p, "--seed-prompts") if x.strip()]
    out = []
    jsonl = bool(lines) and lines[0][1].startswith("{")
    for n, line in lines:
        if not jsonl:
            out.append({"prompt": line, "line": n})
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise Refused(f"{where}: line {n} is not JSON ({e}): give JSONL rows, or plain text throughout") from None
        conv = row.get("conversations") or row.get("messages") if isinstance(row, dict) else None
        user = [m.get("content") for m in conv if isinstance(m, dict) and m.get("role") in ("user", "human")] \
            if isinstance(conv, list) else []
        prompt = user[0] if user else categories.prompt_of(row)
        if not isinstance(prompt, str) or not prompt.strip():
            raise Refused(f"{where}: line {n} holds no prompt text (\"prompt\", \"text\", \"turns\" or a user turn of "
                          f"\"conversations\"; token ids are not a seed): give one a line")
        cat = categories.category_of(row, f"{where}: line {n}")
        out.append({"prompt": prompt.strip(), "line": n, **({"category": cat} if cat else {})})
    if not out:
        raise Refused(f"{where}: no prompt in it: give one a line")
    return out


def steers(a):
    """The system turns that steer the questions, one per topic or seed prompt (None: none, Magpie's plain
    pre-query template)."""
    if a.topics:
        return [TOPIC.format(topic=t) for t in read_topics(a.topics)]
    if a.seed_prompts:
        return [SEED.format(prompt=p["prompt"]) for p in read_seed_prompts(a.seed_prompts)]
    return None


def pre_query(tok, system=None):
    """(the text, its token ids) of the chat template up to where a user's words begin."""
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": MARK}]
    try:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    except Exception as e:  # noqa: BLE001 - a template's own raise_exception, a missing system role
        raise Refused("the verifier's chat template cannot render a user turn"
                      + (" after a system turn (--topics, --seed-prompts)" if system else "")
                      + f": {(str(e).splitlines() or [type(e).__name__])[0][:200]}") from None
    i = text.find(MARK)
    if i <= 0:
        raise Refused("the verifier's chat template does not write a user's words as given: no pre-query template "
                      "can be cut from it")
    return text[:i], tok(text[:i], add_special_tokens=False)["input_ids"]


def tokenizer(model, trust):
    from transformers import AutoTokenizer  # (lazy: the plan's cheap checks first)

    return AutoTokenizer.from_pretrained(model, trust_remote_code=trust)


def plan(a):
    if a.topics and a.seed_prompts:
        raise Refused("--topics and --seed-prompts both steer the questions: give one of them")
    if not a.verifier:
        raise Refused("no verifier: set `verifier:` for the host in hosts.yaml or pass --verifier PATH")
    if verifier_config(a.verifier) is None:
        raise Refused(f"verifier {a.verifier}: no config.json there (a HF model directory is needed)")
    for flag, v in (("--rows", a.rows), ("--question-tokens", a.question_tokens), ("--max-tokens", a.max_tokens),
                    ("--concurrency", a.concurrency), ("--tensor-parallel", a.tensor_parallel),
                    ("--servers", a.servers)):
        if v < 1:
            raise Refused(f"{flag} {v}: give 1 or more")
    if a.servers > a.concurrency:
        raise Refused(f"--servers {a.servers}: more servers than requests in flight (--concurrency "
                      f"{a.concurrency}): give --concurrency {a.servers} or more")
    attempts = a.attempts or 4 * a.rows + 16
    if attempts < a.rows:
        raise Refused(f"--attempts {attempts}: give at least --rows ({a.rows}): each row takes one candidate or more")
    if a.max_model_len is not None and a.max_model_len <= a.question_tokens + a.max_tokens:
        raise Refused(f"--max-model-len {a.max_model_len}: a question ({a.question_tokens} tokens at most) and its "
                      f"answer ({a.max_tokens}) must fit with the template: give more than "
                      f"{a.question_tokens + a.max_tokens}")
    if chat_template(a.verifier) is None:
        raise Refused(f"verifier {a.verifier}: its tokenizer has no chat template (no chat_template.jinja, no "
                      f"`chat_template` in tokenizer_config.json): synthesize writes through one; give a chat "
                      f"(instruct) model")
    vllm_server.check_user_args(a.vllm_arg)
    out = Path(a.out)
    if out.suffix != ".jsonl":
        raise Refused(f"--out {a.out}: the output is a .jsonl file")
    if out.exists() and not a.overwrite:
        raise Refused(f"{out} exists: pick another --out name, or --overwrite to replace it")
    qs, qline = sampling("--question-temperature", a.question_temperature, a.verifier, "questions")
    ans, aline = sampling("--answer-temperature", a.answer_temperature, a.verifier, "answers")
    info = {"verifier": os.path.abspath(a.verifier), "out": str(out.resolve()), "rows": a.rows, "seed": a.seed,
            "attempts": attempts, "question_sampling": qs, "answer_sampling": ans,
            "sampling": [f"{qline}, up to {a.question_tokens} tokens, seeded (--seed {a.seed})",
                         f"{aline}, up to {a.max_tokens} tokens"],
            "trust_remote_code": vllm_server.decide_trust(a.verifier, a.trust_remote_code),
            "tensor_parallel": a.tensor_parallel, "vllm_args": list(a.vllm_arg), "topics": None, "seed_prompts": None}
    for key, path, later, read in (("topics", a.topics, a.topics_later, read_topics),
                                   ("seed_prompts", a.seed_prompts, a.seed_prompts_later, read_seed_prompts)):
        if path and later and not Path(path).exists():
            info[f"{key}_later"] = True  # (a dry run: the laptop's file is uploaded before the real run)
        elif path:
            info[key] = len(read(path))
    seen = [normal(x["prompt"]) for x in read_seed_prompts(a.seed_prompts)] if info["seed_prompts"] else []
    info["resume"] = synth_progress.resumable(a, info, seen)  # (another run's settings there: refused)
    tok = tokenizer(a.verifier, info["trust_remote_code"])
    text, ids = pre_query(tok, TOPIC.format(topic="x") if a.topics else SEED.format(prompt="x") if a.seed_prompts
                          else None)
    info.update(pre_query=text, pre_query_tokens=len(ids))
    if a.servers > 1 and a.kind == "cuda":  # (one GPU's memory shared: each its share, as evaluate's side by side)
        info["shared_args"] = speedup.shared_gpu_args(a.servers, a.vllm_arg, total=speedup.gpu_total_bytes(),
                                                      weights=speedup.weights_bytes(a.verifier),
                                                      tensor_parallel=a.tensor_parallel)
    info["commands"] = [server_cmd(a, info, PORT)] * a.servers
    return info


def server_cmd(a, info, port):
    """The command of the (or each of --servers) vLLM server of the verifier; several on a GPU share its memory."""
    return vllm_server.server_argv(info["verifier"], port, kind=a.kind, max_model_len=a.max_model_len,
                                   tensor_parallel=a.tensor_parallel, trust_remote_code=info["trust_remote_code"],
                                   extra=info.get("shared_args", ()), user_args=a.vllm_arg)


# -- the run ---------------------------------------------------------------------------------------

def post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        choice = json.loads(r.read())["choices"][0]
    text = choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content")
    return (text or "").strip(), choice.get("finish_reason")


class Synth:
    """One run's state: the servers' addresses (candidate i asks server i mod their number), the counts, the rows
    kept (in candidate order)."""

    def __init__(self, a, info, urls, server_dirs, tok, progress=None, done=None):
        self.a, self.info, self.urls, self.server_dirs, self.progress = a, info, urls, server_dirs, progress
        self.done = dict(done or {})  # (i: (question, why dropped, answer, why dropped); a progress file's, resumed)
        self.topics = read_topics(a.topics) if a.topics else None
        self.seeds = read_seed_prompts(a.seed_prompts) if a.seed_prompts else None
        self.prefix = [pre_query(tok, x)[1] for x in steers(a) or [None]]
        # (a seed prompt copied as it is: a duplicate, the user has it already)
        self.rows, self.good, self.good0, self.tried = [], 0, 0, 0  # (good: the answers back that passed, dups aside)
        self.drops = dict.fromkeys(DROPS, 0)
        self.first_error = None
        self.t0 = time.time()
        self.clock = contract.Every()

    def topic(self, i):
        return self.topics[i % len(self.topics)] if self.topics else None

    def ask(self, i):
        body = {"model": self.info["verifier"], "prompt": self.prefix[i % len(self.prefix)],
                "max_tokens": self.a.question_tokens, "seed": seed_of(self.a.seed, i), "skip_special_tokens": True,
                **self.info["question_sampling"]}
        return self.request(i, "/v1/completions", body)

    def answer(self, i, question):
        body = {"model": self.info["verifier"], "messages": [{"role": "user", "content": question}],
                "max_tokens": self.a.max_tokens, "seed": seed_of(self.a.seed, i), **self.info["answer_sampling"]}
        return self.request(i, "/v1/chat/completions", body)

    def request(self, i, path, body):
        try:
            return post(self.urls[i % len(self.urls)] + path, body, self.a.request_timeout)
        except Exception as e:  # noqa: BLE001 - a dead server ends the run; any other failure is one dropped row
            self.check_server()
            self.first_error = self.first_error or f"{type(e).__name__}: {str(e)[:200]}"
            return None, "error"

    def check_server(self):
        for d in self.server_dirs:
            st = (job_state(d) or {}).get("state")
            if st != contract.JobState.RUNNING.value:
                raise vllm_server.ServerDied(vllm_server.died_line(f"the vLLM server exited ({st}) during synthesis",
                                                                  d))

    def candidate(self, i):
        """Candidate i in one worker: (i, its question, why dropped or None, its answer, why dropped or None);
        every question that passes is answered (a duplicate is decided later, in candidate order)."""
        q, finish = self.ask(i)
        qwhy = "error" if finish == "error" else judge_question(q, finish)
        if qwhy:
            return i, q, qwhy, None, None
        ans, finish = self.answer(i, q)
        return i, q, None, ans, ("error" if finish == "error" else judge_answer(ans, finish))

    def row(self, i, q, ans):
        row = {"id": f"synth-{self.a.seed}-{i}", **({"topic": self.topic(i)} if self.topics else {}),
               "conversations": [{"role": "user", "content": q}, {"role": "assistant", "content": ans}]}
        seed = self.seeds[i % len(self.seeds)] if self.seeds else None
        if seed:
            row.update(seed_line=seed["line"], **({"category": seed["category"]} if "category" in seed else {}))
        return row

    def settle(self, done):
        """The rows and drops of the candidates done, in candidate order (the same seed, the same rows, whatever
        order the answers came back in): a question seen before is a duplicate; the first --rows kept are rows."""
        seen = [normal(p["prompt"]) for p in self.seeds or []]  # (a seed prompt copied: the user has it)
        kept, self.drops = synth_progress.settle(done, seen, self.a.rows)
        self.rows = [self.row(i, done[i][0], done[i][2]) for i in kept]

    def run(self):
        """Candidates in order, --concurrency in flight (no batch waits on its slowest answer) until the rows back
        and those in flight (at the share kept so far) make --rows; where duplicates left a shortfall, more go."""
        done, errors, flying, back = self.done, 0, 0, queue.SimpleQueue()  # (back: each one ended, O(1) a candidate)
        self.settle(done)  # (resumed: the candidates judged before count; their indices are not asked again)
        self.good = self.good0 = len(self.rows)
        self.tried, nxt = len(done), 0
        pool = ThreadPoolExecutor(max_workers=self.a.concurrency)
        try:  # (stopped or failed: no wait for those in flight, the server is stopped under them)
            while True:
                # (a verifier that keeps 1 candidate in 6 has 6 in flight for each row still wanted)
                keep = (self.good + 1) / (len(done) + 1) if len(done) >= 8 else 1.0
                while (flying < self.a.concurrency and self.tried < self.info["attempts"]
                       and self.good + keep * flying < self.a.rows):
                    while nxt in done:
                        nxt += 1
                    pool.submit(self.candidate, nxt).add_done_callback(back.put)
                    self.tried, flying, nxt = self.tried + 1, flying + 1, nxt + 1
                if not flying:
                    self.settle(done)
                    self.good = len(self.rows)
                    if self.good >= self.a.rows or self.tried >= self.info["attempts"]:
                        return
                    continue  # (duplicates among the answers back: more candidates)
                finished = drain(back, 1.0)
                flying -= len(finished)
                for f in finished:
                    i, q, qwhy, ans, awhy = f.result()
                    done[i] = (q, qwhy, ans, awhy)
                    if self.progress:
                        self.progress.add(i, q, qwhy, ans, awhy, None if qwhy or awhy else self.row(i, q, ans))
                    self.good += not (qwhy or awhy)
                    if qwhy or awhy:
                        self.drops[qwhy or awhy] += 1  # (live counts; settle's are exact, duplicates among them)
                    errors += "error" in (qwhy, awhy)
                if errors > 8 + len(done) // 10:
                    raise vllm_server.StepFailed(f"{errors} of {len(done)} requests failed (first: "
                                                 f"{self.first_error})")
                if self.clock.due():
                    self.say(f" ({flying} in flight)")
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def rate(self):
        secs = time.time() - self.t0
        return (min(self.good, self.a.rows) - self.good0) / secs if secs > 0 else 0.0

    def say(self, extra=""):
        n, want, r = min(self.good, self.a.rows), self.a.rows, self.rate()
        eta = f"ETA {clock((want - n) / r)}" if r > 0 and n < want else ("done" if n >= want else "ETA ?")
        drops = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in self.drops.items() if v) or "none"
        contract.progress(f"synthesize: {n}/{want} rows, {r:.2f} rows/s, {eta}; {self.tried} candidates, "
                          f"dropped: {drops}{extra}")


def drain(q, timeout):
    """What q holds: the first waited for up to timeout seconds, the rest as they are (none: [])."""
    out = []
    with contextlib.suppress(queue.Empty):
        out.append(q.get(timeout=timeout))
        while True:
            out.append(q.get_nowait())
    return out


def execute(a, info, run_dir):
    for ln in info["sampling"]:
        contract.progress(f"sampling: {ln}")
    tok = tokenizer(a.verifier, info["trust_remote_code"])
    env = vllm_server.server_env(os.getcwd(), a.kind, a.tensor_parallel)
    part = synth_progress.path_of(info["out"])
    if a.overwrite:
        part.unlink(missing_ok=True)  # (starts over)
    _, done, whole = synth_progress.read(part) if info["resume"] else (None, {}, None)
    if info["resume"]:
        r = info["resume"]
        contract.progress(f"synthesize: resuming {Path(a.out).stem}: {r['rows']:,} rows kept of {r['judged']:,} "
                          f"candidates judged (from {r['file']})")
    servers: list = []  # ((dir, port) of each: started together, each then waited for)
    progress = synth_progress.Progress(part, synth_progress.settings(a, info), whole)
    try:
        for k in range(a.servers):
            port = vllm_server.free_port(avoid={p for _, p in servers})
            servers.append((vllm_server.launch(run_dir, server_cmd(a, info, port), env, port,
                                               name="server" if k == 0 else f"server-{k}"), port))
        for d, port in servers:
            vllm_server.wait_started(d, port, a.server_timeout)
        s = Synth(a, info, [f"http://127.0.0.1:{p}" for _, p in servers], [d for d, _ in servers], tok, progress,
                  done)
        s.run()
    finally:
        progress.close()  # (kept: a stopped or failed run resumes from it)
        for d, _ in servers:
            vllm_server.stop(d)
    res = {"rows": len(s.rows), "candidates": s.tried, "dropped": s.drops, "first_error": s.first_error,
           "synthesize_seconds": round(time.time() - s.t0, 1), "rows_per_s": round(s.rate(), 3)}
    if not s.rows:
        part.unlink()  # (the run is over: nothing to resume)
        raise Refused(f"no conversation kept of {s.tried} candidate(s) (dropped: "
                      + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in s.drops.items() if v)
                      + "): raise --question-tokens / --max-tokens, or give a chat model that ends its turns")
    synth_progress.publish(s.rows, info["out"])
    if len(s.rows) < a.rows:
        res["short"] = a.rows - len(s.rows)
        contract.progress(f"only {len(s.rows)} of {a.rows} rows after {s.tried} candidates (--attempts): the filters "
                          f"dropped the rest; raise --attempts or the token caps")
    contract.progress(f"{len(s.rows)} conversation(s) the verifier wrote -> {info['out']} "
                      f"({res['rows_per_s']:.2f} rows/s)")
    return res


def main():
    ap = argparse.ArgumentParser(prog="synthesize.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--verifier", default=None)
    ap.add_argument("--kind", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--topics", default=None)
    ap.add_argument("--seed-prompts", default=None)
    ap.add_argument("--question-temperature", default="1.0")
    ap.add_argument("--answer-temperature", default="0")
    ap.add_argument("--question-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--attempts", type=int, default=None)
    ap.add_argument("--request-timeout", type=float, default=1800)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--tensor-parallel", type=int, default=1)
    ap.add_argument("--trust-remote-code", default="auto", choices=vllm_server.TRUST_CHOICES)
    ap.add_argument("--vllm-arg", action="append", default=[])
    ap.add_argument("--server-timeout", type=float, default=900)
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--topics-later", action="store_true")
    ap.add_argument("--seed-prompts-later", action="store_true")
    ap.add_argument("--result", default=None)
    a = ap.parse_args()
    if a.plan:
        emit({"ok": True, **plan(a)})
        return 0
    contract.watch("verifier", a.verifier)
    run_dir = Path(a.result).parent if a.result else Path(a.out).parent

    def work():
        info = plan(a)  # (again: what changed since the laptop's plan is refused in the result)
        return {**info, **execute(a, info, run_dir)}

    return vllm_server.server_job("synthesize", a.kind, a.result, work)


if __name__ == "__main__":
    contract.main(main)
