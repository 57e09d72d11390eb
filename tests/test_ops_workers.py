"""Operators on both backends (never mutating their input, read-only Ray arrays included),
the Gymnasium runner's counting and autoreset handling, env checks, observation encoding."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from flowkit.core import batch as sb
from flowkit.core.flow import NOT_READY
from flowkit.core.ops import (ConcatBatches, ParallelRollouts, SelectExperiences, StandardizeFields,
                              SyncWeights, TrainOneStep, WorkerRounds, standardize)
from flowkit.core import ActionDist, EnvError, ObsEncoder, derive_seed
from flowkit.engine import load_config, setup


def make_ctx(backend, *overrides):
    env = [] if any(o.startswith("env.factory=") for o in overrides) else ["env=CartPole-v1"]
    pm, cfg = load_config([f"runtime.backend={backend}", "run.reporters=[csv,plot,checkpoint,evaluation]", *env,
                           "runtime.num_workers=2", "runtime.num_envs_per_worker=2",
                           "runtime.rollout_fragment_length=8", *overrides])
    return setup(cfg, pm)


@pytest.fixture(params=["local", "ray"])
def ctx(request):
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    c = make_ctx(request.param)
    yield c
    c.shutdown()


@pytest.mark.slow
def test_operators_on_both_backends_do_not_mutate(ctx):
    from flowkit.core.flow import get_result
    rollouts = ParallelRollouts(ctx, "bulk_sync")
    assert next(rollouts).env_steps == 2 * 2 * 8 and ctx.counters["env_steps_sampled"] == 32
    b = get_result(ctx.workers.actors[0].submit("sample"))  # one worker's batch, as it arrives
    pb = b["default"]
    if ctx.workers.backend == "ray":
        assert not pb[sb.ADVANTAGES].flags.writeable  # what Ray hands back is read-only
    before = {k: np.array(v, copy=True) for k, v in pb.items()}
    merged = ConcatBatches(32)(b)
    assert merged == []
    (merged,) = ConcatBatches(16)(b)
    std = StandardizeFields([sb.ADVANTAGES])(merged)
    assert abs(float(std["default"][sb.ADVANTAGES].mean())) < 1e-5
    sel = SelectExperiences(["default"])(std)
    assert sel.select(["other"]).policy_batches == {}
    w0 = ctx.policies["default"].get_weights()
    learner = ctx.add_learner("ppo", ["default"])
    out = TrainOneStep(ctx, learner, num_epochs=2, minibatch_size=8)(sel)
    assert out["stats"]["default"]["num_sgd_steps"] == 4 and ctx.counters["env_steps_trained"] == 16
    w1 = ctx.policies["default"].get_weights()
    assert any(not np.array_equal(w0[k], w1[k]) for k in w0)
    SyncWeights(ctx, learner)(out)
    remote = ctx.workers.foreach_worker("get_weights")
    for r in remote:
        for k in w1:
            np.testing.assert_array_equal(r["default"][k], w1[k])
    for k, v in before.items():  # nothing above touched the sampled batch
        np.testing.assert_array_equal(pb[k], v)


def test_async_rollouts_record_source_worker(ctx):
    f = ParallelRollouts(ctx, "async").zip_with_source_actor()
    seen = set()
    for _ in range(60):  # completion order depends on timing: read until both workers showed up
        actor, b = f.take(1)[0]
        assert b.worker_index == actor.index
        seen.add(actor.index)
        if seen == {0, 1}:
            break
    assert seen == {0, 1}


class _Play:
    """A worker round's request: ``steps`` env steps and one episode per worker; fails once on
    worker ``fail`` (its first round)."""

    def __init__(self, tag, steps, fail=None):
        self.tag, self.steps, self.fail = tag, steps, fail

    def __call__(self, worker):
        if worker.index == self.fail and not getattr(worker, "_failed_once", False):
            worker._failed_once = True
            raise RuntimeError("worker lost")
        return {"tag": self.tag, "index": worker.index, "env_steps": self.steps, "agent_steps": 2 * self.steps,
                "episodes": [{"return": float(self.steps), "length": self.steps}]}


def test_worker_rounds_send_each_worker_its_request_and_count_the_round():
    """One request per worker per round (made once per round, for the workers of the round), the
    results in worker order, their env and agent steps counted as sampled and their episodes
    recorded; a worker that fails is replaced and missing from that round only."""
    ctx = make_ctx("local", "runtime.restart_failed_workers=true")
    try:
        made = []

        def requests(n):
            made.append(n)
            return [_Play(f"r{len(made)}w{i}", 3 + i, fail=1 if len(made) == 2 else None) for i in range(n)]
        rounds = WorkerRounds(ctx, requests, "Rounds(test)")
        assert "Rounds(test)" in rounds.to_text() and not ctx.workers.started
        first = next(rounds)
        assert [(r["tag"], r["index"]) for r in first] == [("r1w0", 0), ("r1w1", 1)] and made == [2]
        assert ctx.counters["env_steps_sampled"] == 3 + 4 and ctx.counters["agent_steps_sampled"] == 14
        assert ctx.counters["episodes_total"] == 2
        assert list(ctx.metrics.episode_window) == [3.0, 4.0]
        second = next(rounds)  # worker 1 fails: replaced, its result missing
        assert [r["tag"] for r in second] == ["r2w0"] and ctx.workers.num_restarts == 1
        assert ctx.counters["env_steps_sampled"] == 7 + 3 and ctx.counters["episodes_total"] == 3
        third = next(rounds)
        assert [r["tag"] for r in third] == ["r3w0", "r3w1"] and made == [2, 2, 2]
    finally:
        ctx.shutdown()


def test_standardize_guards():
    assert standardize(np.array([3.0])).tolist() == [3.0]
    assert standardize(np.array([2.0, 2.0, 2.0])).tolist() == [0.0, 0.0, 0.0]
    np.testing.assert_allclose(standardize(np.array([1.0, 3.0])), [-1.0, 1.0])


def test_env_steps_are_real_transitions_and_fragments_exact():
    """Counter env, sub-env j has TimeLimit(3 + j): the reset step of next-step autoreset is
    never a transition; each sub-env gives exactly rollout_fragment_length rows."""
    got = {}
    for mode in ("next_step", "same_step"):
        c = make_ctx("local", "env.factory=envs:counter", f"env.autoreset_mode={mode}",
                     "runtime.num_workers=1", "runtime.rollout_fragment_length=12")
        w = c.workers.actors[0].obj
        b1, b2 = w.sample(), w.sample()
        assert b1.env_steps == 24 and len(b1["default"]) == 24
        got[mode] = [b1["default"], b2["default"]]
        c.shutdown()
    for a, b in zip(got["next_step"], got["same_step"]):
        for col in (sb.OBS, sb.NEXT_OBS, sb.REWARDS, sb.TERMINATEDS, sb.TRUNCATEDS):
            np.testing.assert_array_equal(a[col], b[col])
    first = got["next_step"][0]
    obs = first[sb.OBS].argmax(1)
    nxt = first[sb.NEXT_OBS].argmax(1)
    assert obs[:12].tolist() == [0, 1, 2] * 4 and obs[12:].tolist() == [0, 1, 2, 3] * 3
    assert (nxt == obs + 1).all()  # never a final -> reset transition
    assert first[sb.TRUNCATEDS].sum() == 4 + 3 and not first[sb.TERMINATEDS].any()


def test_unsupported_autoreset_mode_fails_at_setup():
    from flowkit import ConfigError
    with pytest.raises(ConfigError, match="env.autoreset_mode='disabled' must be 'next_step' or 'same_step'"):
        make_ctx("local", "env.autoreset_mode=disabled")


@pytest.mark.parametrize("mode,where,expected", [
    ("shape", "obs.pos", "Box(shape=(3,)"),
    ("bounds", "obs.pos", "out of bounds"),
    ("reward", "reward", "a finite float scalar"),
])
def test_bad_env_output_names_env_worker_key_expected_received(mode, where, expected):
    c = make_ctx("local", "env.factory=envs:BadObsEnv", f"env.kwargs.mode={mode}",
                 "runtime.num_workers=1", "env.check_spaces_steps=5")
    with pytest.raises(EnvError) as ei:
        c.workers.start()
        c.workers.actors[0].obj.sample()
    msg = str(ei.value)
    assert "env 'envs:BadObsEnv'" in msg and "worker 0, sub-env 0" in msg
    assert f"at `{where}`" in msg and expected in msg and "received" in msg


def test_env_factory_receives_context_and_seeds_differ():
    seen = []

    def factory(context):
        seen.append(context)
        return __import__("envs").constant()
    import envs
    envs.recording_factory = factory
    c = make_ctx("local", "env.factory=envs:recording_factory", "runtime.num_workers=2", "seed=3")
    c.workers.start()
    ctxs = [s for s in seen if s.worker_index >= 0]
    assert sorted((s.worker_index, s.vector_index) for s in ctxs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len({s.seed for s in ctxs}) == 4
    assert ctxs[0].seed == derive_seed(3, "env", ctxs[0].worker_index, ctxs[0].vector_index, 0)
    assert all(s.num_workers == 2 and s.restart_count == 0 for s in ctxs)
    c.shutdown()


def test_obs_encoding_by_space():
    d = spaces.Dict({"b": spaces.Discrete(3), "a": spaces.Box(-1, 1, (2,)),
                     "action_mask": spaces.MultiBinary(3)})
    enc = ObsEncoder(d)
    assert enc.shape == (5,) and enc.has_mask
    x, m = enc({"b": np.array([2]), "a": np.array([[0.5, -0.5]]), "action_mask": np.array([[1, 0, 1]])}, 1)
    order = list(d.spaces)  # the space's own key order
    assert order == ["a", "action_mask", "b"]  # gymnasium sorts Dict keys
    assert x.tolist() == [[0.5, -0.5, 0, 0, 1]] and m.tolist() == [[1, 0, 1]]
    t = ObsEncoder(spaces.Tuple((spaces.MultiDiscrete([2, 3]), spaces.MultiBinary(2))))
    x, _ = t((np.array([[1, 2]]), np.array([[1, 0]])), 1)
    assert x.tolist() == [[0, 1, 0, 0, 1, 1, 0]]
    img = ObsEncoder(spaces.Box(0, 255, (84, 84, 3), np.uint8))
    assert img.is_image and img.shape == (3, 84, 84)
    raw = np.random.default_rng(0).integers(0, 256, (2, 84, 84, 3), dtype=np.uint8)
    x, _ = img(raw, 2)  # uint8 frames stay bytes (issue 23): the CNN scales them on the learner's device
    assert x.shape == (2, 3, 84, 84) and x.dtype == np.uint8 and np.array_equal(x, raw.transpose(0, 3, 1, 2))
    from flowkit.core import SmallCNN
    cnn = SmallCNN(img.shape)
    torch.testing.assert_close(cnn(torch.from_numpy(x)), cnn(torch.from_numpy(x).float() / 255.0))


def test_action_distributions_match_torch():
    md = ActionDist(spaces.MultiDiscrete([2, 3]))
    logits = torch.randn(4, 5)
    a = md.sample(logits)
    ref = (torch.distributions.Categorical(logits=logits[:, :2]).log_prob(a[:, 0])
           + torch.distributions.Categorical(logits=logits[:, 2:]).log_prob(a[:, 1]))
    torch.testing.assert_close(md.logp(logits, a), ref)
    mb = ActionDist(spaces.MultiBinary(3))
    a = mb.sample(logits[:, :3])
    ref = torch.distributions.Bernoulli(logits=logits[:, :3]).log_prob(a.float()).sum(-1)
    torch.testing.assert_close(mb.logp(logits[:, :3], a), ref)
    torch.testing.assert_close(mb.entropy(logits[:, :3]),
                               torch.distributions.Bernoulli(logits=logits[:, :3]).entropy().sum(-1))
    g = ActionDist(spaces.Box(-2, 2, (2,)))
    inp = torch.cat([torch.randn(4, 2), torch.full((4, 2), -0.3)], -1)
    a = g.sample(inp)
    ref = torch.distributions.Normal(inp[:, :2], torch.exp(inp[:, 2:])).log_prob(a).sum(-1)
    torch.testing.assert_close(g.logp(inp, a), ref)
    assert g.to_env(np.array([[-1.0, 3.0]], np.float32)).tolist() == [[-2.0, 2.0]]
    cat = ActionDist(spaces.Discrete(3))
    mask = torch.tensor([[1, 0, 1]])
    for _ in range(20):
        assert cat.sample(torch.zeros(1, 3), mask).item() != 1


# ---- acting in numpy: the same function as the torch model ---------------------------------------
@pytest.mark.parametrize("algo,space,over", [
    ("ppo", spaces.Discrete(3), {}),
    ("ppo", spaces.Box(-2.0, 3.0, (2,)), {"normalize_observations": True}),
    ("ppo", spaces.Discrete(4), {"activation": "relu", "hidden": [16]}),
    ("impala", spaces.Discrete(3), {}),
    ("impala", spaces.Box(-1.0, 1.0, (2,)), {"hidden": [8, 8, 8]}),
])
def test_numpy_inference_matches_torch(algo, space, over):
    import flowkit
    from flowkit.core import ActorCritic
    cls = flowkit.get_plugin_manager().algorithms()[algo]
    cfg = cls.config_class()
    if "normalize_observations" in over:
        cfg.normalize_observations = True
    model_cfg = dict(hidden_sizes=over.get("hidden", [32, 32]), activation=over.get("activation", "tanh"),
                     shared_value_network=False, numpy_inference=True)
    obs_space = spaces.Box(-5.0, 5.0, (6,))
    pol = cls.policy_class(obs_space, space, cfg, model_cfg, "cpu", seed=3, inference_only=True)
    npm = pol.numpy_model()
    assert npm is not None
    rng = np.random.default_rng(0)
    x = rng.normal(size=(9, 6)).astype(np.float32)
    if pol.model.obs_rms is not None:
        pol.model.obs_rms.update(torch.from_numpy(rng.normal(2.0, 3.0, size=(50, 6)).astype(np.float32)))
    with torch.no_grad():
        t_inputs, t_value = pol.model(torch.from_numpy(x))
    out = npm.forward(x)
    n_inputs, n_value = out["pi"], out["vf"][:, 0]
    np.testing.assert_allclose(n_inputs, t_inputs.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(n_value, t_value.numpy(), rtol=1e-5, atol=1e-6)
    # sampled actions: logp equals the torch distribution's log-prob of the same actions
    a, extras = pol.compute_actions_encoded(x, None, True)
    t_logp = pol.dist.logp(t_inputs, torch.from_numpy(a))
    np.testing.assert_allclose(extras[sb.ACTION_LOGP], t_logp.numpy(), rtol=1e-5, atol=1e-5)
    greedy, _ = pol.compute_actions_encoded(x, None, False)
    want = t_inputs.argmax(-1).numpy() if pol.dist.kind == "cat" else t_inputs[:, :pol.dist.dim].numpy()
    np.testing.assert_allclose(greedy, want, rtol=1e-5, atol=1e-6)
    # new weights are seen without rebuilding anything by hand
    w = {k: v + 0.1 for k, v in pol.get_weights().items()}
    pol.set_weights(w)
    with torch.no_grad():
        t_inputs2, _ = pol.model(torch.from_numpy(x))
    np.testing.assert_allclose(npm.forward(x)["pi"], t_inputs2.numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(t_inputs2.numpy(), t_inputs.numpy())
    assert type(pol.model) is ActorCritic


def test_numpy_inference_masks_and_fallbacks():
    import flowkit
    from types import SimpleNamespace
    from flowkit.core import ActorCritic
    ppo = flowkit.get_plugin_manager().algorithms()["ppo"]
    mc = SimpleNamespace(hidden_sizes=[16], activation="tanh", shared_value_network=False, numpy_inference=True)
    pol = ppo.policy_class(spaces.Box(-1.0, 1.0, (3,)), spaces.Discrete(4), ppo.config_class(), mc, "cpu", 0, True)
    x = np.random.default_rng(1).normal(size=(200, 3)).astype(np.float32)
    mask = np.zeros((200, 4), np.int8)
    mask[:, 1] = 1
    mask[::2, 3] = 1
    a, ex = pol.compute_actions_encoded(x, mask, True)
    assert set(a[1::2].tolist()) == {1} and set(a[::2].tolist()) == {1, 3}
    assert np.isfinite(ex[sb.ACTION_LOGP]).all() and (ex[sb.ACTION_LOGP][1::2] == 0).all()
    with pytest.raises(ValueError, match="allows no action in rows"):
        pol.compute_actions_encoded(x[:2], np.zeros((2, 4), np.int8), True)
    # not mirrored: a shared trunk, other activations, switched off, a subclassed model
    for over in (dict(shared_value_network=True), dict(activation="elu"), dict(numpy_inference=False)):
        p = ppo.policy_class(spaces.Box(-1.0, 1.0, (3,)), spaces.Discrete(4), ppo.config_class(),
                             SimpleNamespace(**{**vars(mc), **over}), "cpu", 0, True)
        assert p.numpy_model() is None
        assert p.compute_actions_encoded(x[:5], None, True)[0].shape == (5,)

    class MyAC(ActorCritic):
        pass
    p = ppo.policy_class(spaces.Box(-1.0, 1.0, (3,)), spaces.Discrete(4), ppo.config_class(), mc, "cpu", 0, True)
    p.model.__class__ = MyAC
    assert p.numpy_model() is None


@pytest.mark.parametrize("algo,space,over", [
    ("ppo", spaces.Discrete(3), {}), ("ppo", spaces.Box(-2.0, 2.0, (2,)), {"normalize_observations": True}),
    ("impala", spaces.Discrete(3), {}), ("dqn", spaces.Discrete(3), {"dueling": True}),
    ("dqn", spaces.Discrete(3), {"dueling": False, "activation": "relu"})])
def test_numpy_worker_policies_act_as_the_torch_ones(algo, space, over):
    """Issue 12: what a Ray worker builds instead of a policy acting in numpy (no torch there)
    takes the same actions from the same seed and weights, with the same extras and GAE."""
    from types import SimpleNamespace
    import flowkit
    cls = flowkit.get_plugin_manager().algorithms()[algo]
    cfg = cls.config_class()
    for k in ("normalize_observations", "dueling"):
        if k in over:
            setattr(cfg, k, over[k])
    mc = SimpleNamespace(hidden_sizes=[16, 16], activation=over.get("activation", "tanh"),
                         shared_value_network=False, numpy_inference=True)
    obs_space = spaces.Box(-5.0, 5.0, (4,))
    driver = cls.policy_class(obs_space, space, cfg, mc, "cpu", seed=1)
    wcls = driver.worker_policy_class()
    assert wcls is not None
    torch_w, np_w = (c(obs_space, space, cfg, mc, "cpu", 7, inference_only=True) for c in (cls.policy_class, wcls))
    w = driver.get_weights()
    if "obs_rms.mean" in w:
        w["obs_rms.mean"], w["obs_rms.var"] = w["obs_rms.mean"] + 0.5, w["obs_rms.var"] * 2
    torch_w.set_weights(w)
    np_w.set_weights(w)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    if algo == "dqn":
        torch_w.epsilon = np_w.epsilon = 0.3
    a1, e1 = torch_w.compute_actions_encoded(x, None, True)
    a2, e2 = np_w.compute_actions_encoded(x, None, True)
    np.testing.assert_array_equal(a1, a2)
    assert e1.keys() == e2.keys()
    for k in e1:
        np.testing.assert_allclose(e1[k], e2[k], rtol=1e-5, atol=1e-6)
    assert (np_w.compute_actions(x[0]) == torch_w.compute_actions(x[0])).all()
    batch = sb.SampleBatch({sb.OBS: x[:4], sb.NEXT_OBS: x[4:8], sb.ACTIONS: a1[:4], sb.REWARDS: np.ones(4, np.float32),
                            sb.TERMINATEDS: np.array([False, True, False, False]), sb.TRUNCATEDS: np.zeros(4, bool),
                            sb.EPS_ID: np.array([1, 1, 2, 2]), **{k: v[:4] for k, v in e1.items()}})
    p1, p2 = torch_w.postprocess_trajectory(batch), np_w.postprocess_trajectory(batch)
    assert p1.keys() == p2.keys()
    for k in p1:
        np.testing.assert_allclose(p1[k], p2[k], rtol=1e-5, atol=1e-5)

    class Mine(cls.policy_class):  # a subclass that acts its own way keeps torch on the workers
        def compute_actions_encoded(self, obs, mask=None, explore=True):
            return super().compute_actions_encoded(obs, mask, explore)
    assert Mine(obs_space, space, cfg, mc, "cpu", seed=1).worker_policy_class() is None


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_ray_workers_of_numpy_policies_import_no_torch(algo, tmp_path):
    """Issue 12: a Ray rollout worker's process (built as the Ray actor is, from the specs the
    WorkerSet sends) samples and postprocesses without importing torch."""
    import pickle
    import subprocess
    import sys
    c = make_ctx("ray", f"algo={algo}", "runtime.num_workers=1")
    assert type(c.workers.remote_specs["default"].policy_class).__name__ == "partial"
    f = tmp_path / "specs.pkl"
    f.write_bytes(pickle.dumps((c.workers._container, c.workers.remote_specs, c.get_weights(None), c.workers.make_pm)))
    code = ("import pickle, sys\nfrom flowkit.core.workers import RolloutWorker\n"
            f"cfg, specs, w, make_pm = pickle.loads(open({str(f)!r}, 'rb').read())\n"
            "rw = RolloutWorker(cfg, 0, 1, specs, make_pm=make_pm)\nrw.set_weights(w, 1)\nb = rw.sample()\n"
            "print(b.env_steps, 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    steps, torch_loaded = p.stdout.split()
    assert int(steps) > 0 and torch_loaded == "False"


@pytest.mark.parametrize("inline", [True, False])
def test_ray_weights_small_go_inside_the_call_large_through_one_put_per_version(ray_session, monkeypatch, inline):
    """A small network's weights travel by value in each call (no object-store round trip per
    push); larger ones are put once per version and the reference reused for every worker."""
    import ray
    from flowkit.core import workers as W
    ctx = make_ctx("ray")
    try:
        ctx.workers.actors  # started before counting puts
        w = {"default": {k: v + 1.0 for k, v in ctx.policies["default"].get_weights().items()}}
        assert 0 < W.weights_nbytes(w) <= W.INLINE_WEIGHTS_BYTES  # CartPole's default MLP is small
        if not inline:
            monkeypatch.setattr(W, "INLINE_WEIGHTS_BYTES", 0)
        puts = []
        real_put = ray.put
        monkeypatch.setattr(ray, "put", lambda x, **kw: puts.append(x) or real_put(x, **kw))
        ctx.workers.sync_weights(w, version=7)
        ctx.workers.sync_weights(w, actors=ctx.workers.actors[:1], version=7)  # same version: the same ref
        assert len(puts) == (0 if inline else 1)
        for r in ctx.workers.foreach_worker("get_weights"):
            for k, v in w["default"].items():
                np.testing.assert_array_equal(r["default"][k], v)
    finally:
        ctx.shutdown()
