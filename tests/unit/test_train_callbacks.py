"""The Hugging Face and Lightning callbacks in real trainers (CPU, a few steps), each
reporting one step per optimizer step / batch through slurmhealth.job. Skipped where the
framework is not installed (`pip install -e '.[hf]'` / `'.[lightning]'`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurmhealth import job
from tests.support.skips import require_module

torch = require_module("torch", "PyTorch not installed (pip install '.[train]')")


@pytest.fixture
def job_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    out = tmp_path / "job"
    out.mkdir()
    monkeypatch.setenv("SLURMHEALTH_JOB_DIR", str(out))
    monkeypatch.setenv("RANK", "0")
    job.close()
    yield out
    job.close()


def steps(job_dir: Path) -> list[dict[str, Any]]:
    job.flush()
    text = (job_dir / "steps-0.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


class TinyLM(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 50)

    def forward(self, input_ids: Any, labels: Any = None) -> Any:
        logits = self.head(self.embed(input_ids))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1))
        return {"loss": loss, "logits": logits}


def test_hugging_face_trainer_reports_each_optimizer_step(tmp_path: Path, job_dir: Path) -> None:
    transformers = require_module("transformers", "transformers not installed")
    from slurmhealth.train.hf import SlurmhealthCallback

    data = [
        {"input_ids": torch.arange(i, i + 16) % 50, "labels": torch.arange(16) % 50}
        for i in range(32)
    ]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=4,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        include_num_input_tokens_seen=True,
        disable_tqdm=True,
    )
    callback = SlurmhealthCallback(flops_per_token=100.0)
    trainer = transformers.Trainer(
        model=TinyLM(), args=args, train_dataset=data, callbacks=[callback]
    )
    trainer.train()
    got = steps(job_dir)
    assert [s["step"] for s in got] == [1, 2, 3, 4]
    assert {s["samples"] for s in got} == {6}  # 2 per device x 3 accumulated
    assert {s["tokens"] for s in got} == {6 * 16}  # from the Trainer's own token count
    assert {s["flops"] for s in got} == {6 * 16 * 100.0}
    assert all(s["data_wait_seconds"] is not None for s in got)


def test_hugging_face_tokens_from_tokens_per_sample(tmp_path: Path, job_dir: Path) -> None:
    transformers = require_module("transformers", "transformers not installed")
    from slurmhealth.train.hf import SlurmhealthCallback

    data = [{"input_ids": torch.arange(8) % 50, "labels": torch.arange(8) % 50}] * 8
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=TinyLM(),
        args=args,
        train_dataset=data,
        callbacks=[SlurmhealthCallback(tokens_per_sample=8)],
    )
    trainer.train()
    assert [(s["step"], s["samples"], s["tokens"]) for s in steps(job_dir)] == [
        (1, 4, 32),
        (2, 4, 32),
    ]


def test_lightning_trainer_reports_each_batch(tmp_path: Path, job_dir: Path) -> None:
    pl = require_module("lightning.pytorch", "lightning not installed")
    from slurmhealth.train.lightning import SlurmhealthCallback

    class Module(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lm = TinyLM()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.lm(**batch)["loss"]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = [{"input_ids": torch.arange(12) % 50, "labels": torch.arange(12) % 50}] * 20
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    callback = SlurmhealthCallback(flops_per_token=10.0)
    trainer = pl.Trainer(
        max_steps=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[callback],
    )
    trainer.fit(Module(), loader)
    got = steps(job_dir)
    assert [s["step"] for s in got] == [1, 2, 3]
    assert {(s["samples"], s["tokens"], s["flops"]) for s in got} == {(4, 48, 480.0)}
    assert callback.hooked is False  # one device: no DDP to hook
