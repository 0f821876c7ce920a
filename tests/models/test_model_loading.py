"""load_model from local directories, dtype/device parsing, error messages, vocab checks and threads."""

from __future__ import annotations

import pytest
import torch

from frspec.errors import FrspecError
from frspec.models import loading
from frspec.models.loading import (
    auto_dtype,
    check_same_vocab,
    load_model,
    parse_dtype,
    resolve_model_dir,
    set_threads,
    vocab_size_of,
)

from tests.models.tiny_gguf_models import logits, tiny_qwen2


@pytest.fixture
def saved_dir(tmp_path):
    model = tiny_qwen2(vocab_size=96)
    path = tmp_path / "tiny-hf"
    model.save_pretrained(path)
    return path, model


@pytest.mark.parametrize(
    "name, expected",
    [("bf16", torch.bfloat16), ("BF16", torch.bfloat16), ("bfloat16", torch.bfloat16), ("fp16", torch.float16),
     ("float16", torch.float16), ("fp32", torch.float32), ("torch.float32", torch.float32), ("fp64", torch.float64),
     (torch.float16, torch.float16), ("auto", None)],
)
def test_parse_dtype_accepts_names_and_torch_dtypes(name, expected):
    assert parse_dtype(name) == expected


@pytest.mark.parametrize("bad", ["int8", "fp8", "", "float17", torch.int64])
def test_parse_dtype_rejects_unknown(bad):
    with pytest.raises(FrspecError, match="dtype"):
        parse_dtype(bad)


def test_auto_dtype_is_bf16_on_cpu_and_the_models_half_dtype_on_gpu():
    config = tiny_qwen2(vocab_size=64).config
    gpu = torch.device("cuda")  # only inspected, never used
    config.dtype = torch.float16
    assert auto_dtype(config, torch.device("cpu")) == torch.bfloat16
    assert auto_dtype(config, gpu) == torch.float16
    config.dtype = "bfloat16"
    assert auto_dtype(config, gpu) == torch.bfloat16
    config.dtype = torch.float32
    assert auto_dtype(config, gpu) == torch.bfloat16


def test_load_local_directory_exact_in_fp32(saved_dir):
    path, reference = saved_dir
    model = load_model(str(path), dtype="fp32")
    assert model.dtype == torch.float32
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert torch.equal(logits(model, ids=(1, 2, 3, 95)), logits(reference, ids=(1, 2, 3, 95)))


def test_load_auto_dtype_on_cpu_is_bf16(saved_dir):
    path, reference = saved_dir
    model = load_model(path)  # a Path works as well as a str
    assert model.dtype == torch.bfloat16
    close = torch.allclose(logits(model, ids=(1, 2, 3)), logits(reference, ids=(1, 2, 3)), atol=0.05)
    assert close


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FrspecError, match="not found"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(FrspecError, match="not found"):
        load_model("./relative/missing-dir")
    with pytest.raises(FrspecError, match="not found"):
        load_model(str(tmp_path / "missing.gguf"))


def test_directory_without_config_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(FrspecError, match="not a model directory"):
        load_model(str(tmp_path))


def test_plain_file_is_rejected(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(FrspecError, match="not a model directory"):
        load_model(str(path))


def test_directory_with_config_but_no_weights(saved_dir):
    path, _ = saved_dir
    (path / "model.safetensors").unlink()
    with pytest.raises(FrspecError, match="cannot load model"):
        load_model(str(path))


def test_bad_arguments_fail_before_any_loading(monkeypatch, saved_dir):
    path, _ = saved_dir
    monkeypatch.setattr(loading, "resolve_model_dir", lambda *a: pytest.fail("resolved despite bad arguments"))
    with pytest.raises(FrspecError, match="unknown dtype"):
        load_model(str(path), dtype="fp12")
    with pytest.raises(FrspecError, match="device"):
        load_model(str(path), device="tpu:banana")


def test_cuda_request_without_cuda(saved_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(FrspecError, match="CUDA is not available"):
        load_model(str(saved_dir[0]), device="cuda")


def test_hub_ids_pass_through_and_deep_paths_do_not():
    assert resolve_model_dir("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert resolve_model_dir("gpt2") == "gpt2"
    with pytest.raises(FrspecError, match="not found"):
        resolve_model_dir("models/qwen/latest")


def test_check_same_vocab_names_both_sizes():
    target, draft = tiny_qwen2(vocab_size=80), tiny_qwen2(vocab_size=64)
    with pytest.raises(FrspecError, match=r"target has 80 .* draft has 64"):
        check_same_vocab(target, draft)
    assert check_same_vocab(target, tiny_qwen2(vocab_size=80, seed=1)) == 80


def test_vocab_size_counts_output_rows_not_config():
    model = tiny_qwen2(vocab_size=64)
    model.resize_token_embeddings(72)  # padded heads (e.g. 151,936 rows for 151,665 tokens) are what counts
    model.config.vocab_size = 64
    assert vocab_size_of(model) == 72


def test_set_threads():
    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 == torch.get_num_threads()
        assert set_threads(None) == 1
        with pytest.raises(FrspecError, match="at least 1"):
            set_threads(0)
    finally:
        torch.set_num_threads(before)
