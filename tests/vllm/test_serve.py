"""vLLM's OpenAI-compatible server with FR-Spec, started with `frspec serve` as users run it: vLLM's own processes (API server, engine core, worker) each load the
plugin from the environment; an OpenAI client talks to it on 127.0.0.1, with and without streaming."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from tests.vllm.vllm_tiny import PROMPTS, hf_greedy

STARTUP_S = 400
NEW_TOKENS = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT_TRIES = 3


def _stop(proc: subprocess.Popen) -> None:
    """Stops the server and the engine processes it started (its own session's group), if any are left."""
    try:
        os.killpg(proc.pid, 15)
    except ProcessLookupError:  # the whole group already exited (a server that failed to start)
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


def _ready(proc: subprocess.Popen, port: int, log: Path) -> bool:
    """Waits for the server's health check: True once it answers, False if the server exited first (fails the test
    after STARTUP_S)."""
    deadline = time.monotonic() + STARTUP_S
    while proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"vllm serve not ready after {STARTUP_S}s:\n{log.read_text()[-3000:]}")
        time.sleep(1)
    return False


@contextlib.contextmanager
def serving(tiny, target: str, spec: dict, log_name: str):
    """`frspec serve` with the tiny map for `target` and `spec`; yields (base URL, log path); stops it after.

    The port is free when chosen but may be taken before vLLM binds it: vLLM processes in the other test workers open
    ports of their own (ZMQ, torch.distributed) at random. Only that race is retried, with a fresh port."""
    log = Path(tiny.root) / log_name
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "FRSPEC_TOKEN_MAP")}
    for attempt in range(PORT_TRIES):
        port = _free_port()
        # `frspec serve` sets FRSPEC_TOKEN_MAP and becomes vLLM's server (same process: the group is stopped below).
        cmd = [str(Path(sys.executable).parent / "frspec"), "serve", "--token-map", tiny.token_map, "--",
               "--model", target, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--enforce-eager", "--max-model-len", "256", "--seed", "0", "--speculative-config", json.dumps(spec)]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if _ready(proc, port, log):
                yield f"http://127.0.0.1:{port}/v1", log
                return
            text = log.read_text()
            if "Address already in use" not in text or attempt + 1 == PORT_TRIES:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{text[-3000:]}")
        finally:
            _stop(proc)


@pytest.fixture(scope="module")
def server(tiny):
    spec = {"method": "draft_model", "model": tiny.draft, "num_speculative_tokens": 3}
    with serving(tiny, tiny.target, spec, "serve.log") as served:
        yield served


def _client(url):
    from openai import OpenAI

    return OpenAI(base_url=url, api_key="unused", timeout=60, max_retries=0)


def test_every_vllm_process_loaded_the_map(server):
    _, log = server
    text = log.read_text()
    assert "FR-Spec: Qwen2ForCausalLM scores 40 of 96 target ids" in text
    assert "FR-Spec confirmed before serving: runner V1, drafter DraftModelProposer (Qwen2ForCausalLM)" in text


def test_completions_equal_the_target_alone(server, tiny):
    url, _ = server
    client = _client(url)
    reference = hf_greedy(tiny.target, PROMPTS, NEW_TOKENS)
    for prompt, expected in zip(PROMPTS, reference):
        out = client.completions.create(model=tiny.target, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0,
                                        extra_body={"ignore_eos": True, "return_token_ids": True})
        assert out.choices[0].token_ids == expected


def test_streaming_chat_matches_the_unstreamed_reply(server, tiny):
    url, _ = server
    client = _client(url)
    messages = [{"role": "user", "content": "hello there"}]
    args = dict(model=tiny.target, messages=messages, max_tokens=NEW_TOKENS, temperature=0,
                extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**args).choices[0].message.content
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args)
              if c.choices]
    assert len(pieces) > 1 and "".join(pieces) == whole


def test_mtp_served_as_the_docs_show(tiny):
    """docs/vllm.md's MTP example: `frspec serve --token-map MAP -- --model MIMO --speculative-config
    '{"method": "mtp", ...}'` (a tiny MiMo checkpoint): every worker confirms the pruned head, and completions equal
    the target's greedy output."""
    spec = {"method": "mtp", "num_speculative_tokens": 3}
    with serving(tiny, tiny.mimo_target, spec, "serve-mtp.log") as (url, log):
        client = _client(url)
        for prompt, expected in zip(PROMPTS[:2], hf_greedy(tiny.mimo_target, PROMPTS[:2], NEW_TOKENS)):
            out = client.completions.create(model=tiny.mimo_target, prompt=prompt, max_tokens=NEW_TOKENS,
                                            temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
            assert out.choices[0].token_ids == expected
        assert "FR-Spec confirmed before serving: runner V1, drafter EagleProposer (MiMoMTP)" in log.read_text()
