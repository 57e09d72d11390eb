"""Issue 14, part 3: the TensorBoard, MLflow and W&B reporters each hold the metrics and the
hyperparameters of a short run; a missing package is a one-line config error."""
import glob
import json
import os
import struct

import pytest
from test_reporters import TINY

import flowkit
from flowkit.cli import main


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("loggers") / "run")
    os.environ.setdefault("WANDB_SILENT", "true")
    res = flowkit.train(TINY + [f"run.dir={run_dir}", "stop.iterations=3", "ppo.lr=0.00123",
                                "run.reporters=[csv,tensorboard,mlflow,wandb]"])
    return run_dir, res


def test_tensorboard_events_hold_metrics_and_hparams(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2
    run_dir, res = tracked
    ea = EventAccumulator(os.path.join(run_dir, "tb")).Reload()
    pts = ea.Scalars("episode_return_mean")
    assert [(p.step, p.value) for p in pts] == [(r["env_steps_sampled"], pytest.approx(r["episode_return_mean"]))
                                               for r in res.history]
    content = ea.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hp = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hp["ppo.lr"].number_value == pytest.approx(0.00123) and hp["algo"].string_value == "ppo"


def test_mlflow_run_holds_metrics_and_params(tracked):
    from mlflow.tracking import MlflowClient
    run_dir, res = tracked
    client = MlflowClient(tracking_uri="file:" + os.path.join(os.path.dirname(run_dir), "mlruns"))
    exp = client.get_experiment_by_name("ppo-envs:FixedLenEnv")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert float(run.data.params["ppo.lr"]) == pytest.approx(0.00123)
    hist = client.get_metric_history(run.info.run_id, "env_steps_sampled")
    assert [m.value for m in hist] == [r["env_steps_sampled"] for r in res.history]
    assert [m.step for m in hist] == [r["env_steps_sampled"] for r in res.history]


def _wandb_records(path):
    """The protobuf records of an offline ``.wandb`` file (a LevelDB-style log: a 7-byte
    header, then 32 KiB blocks of records, each with a 7-byte header: crc, length, type)."""
    from wandb.proto import wandb_internal_pb2 as pb
    data, pos, buf, out = open(path, "rb").read(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # the zero padding at a block's end
            pos += left
            continue
        buf, pos = buf + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # a full record, or the last piece of one
            out.append(pb.Record.FromString(buf))
            buf = b""
    return out


def _key(item):
    return item.key or "/".join(item.nested_key)


def test_offline_wandb_run_holds_metrics_and_config(tracked):
    run_dir, res = tracked
    (path,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    recs = _wandb_records(path)
    (run,) = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
    config = {_key(i): json.loads(i.value_json) for i in run.config.update}
    assert config["ppo.lr"] == pytest.approx(0.00123) and config["algo"] == "ppo"
    rows = [{_key(i): json.loads(i.value_json) for i in r.history.item} for r in recs
            if r.WhichOneof("record_type") == "history"]
    assert [(r["env_steps_sampled"], r["episode_return_mean"]) for r in rows] == [
        (h["env_steps_sampled"], pytest.approx(h["episode_return_mean"])) for h in res.history]
    assert any(r.WhichOneof("record_type") == "exit" for r in recs)


@pytest.mark.parametrize("name,module", [("tensorboard", "tensorboard"), ("mlflow", "mlflow"), ("wandb", "wandb")])
def test_a_missing_package_is_one_line(name, module, monkeypatch, capsys, tmp_path):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m == module else real(m, *a))
    assert main(["train", *TINY, f"run.dir={tmp_path}/run", f"run.reporters=[csv,{name}]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"flowkit: config error: run.reporters: `{name}` needs the {module} package "
                   f"(pip install 'flowkit[{name}]'), or take `{name}` out of run.reporters"]
    assert not os.path.exists(tmp_path / "run")
