"""``flowkit export``: a trained policy as one self-contained module, raw observation -> action.

The module (:class:`ExportedPolicy`) holds what ``policy.compute_actions(obs, explore=False)``
does, in torch ops only, so it runs without flowkit (TorchScript in any libtorch, ONNX in any
ONNX runtime):

1. observation encoding by space: the policy's own :meth:`flowkit.core.ObsEncoder.encode`,
   traced with tensors (:class:`TorchOps`): Box flattened (images transposed to (C, H, W), uint8
   kept: the network scales it), Discrete and MultiDiscrete one-hot, MultiBinary as floats, Dict /
   Tuple leaves concatenated in the space's order;
2. the policy's network from :meth:`Policy.action_model` (observation normalisation,
   ``obs_rms``, included);
3. greedy action selection: argmax of the (masked) logits or Q-values for Discrete and
   MultiDiscrete, ``logit > 0`` for MultiBinary, the Gaussian mean for Box;
4. into the env's action space: the policy's own :meth:`ActionDist.to_env`, traced (:class:`TorchOps`): Discrete ``start`` added, Box
   scaled from [-1, 1] to its bounds, then clipped (integer Box rounded), the space's dtype.

Inputs are the observation's leaves as separate arrays, each with a leading batch axis, in
the space's order (:func:`input_arrays` builds them from raw observations): a Box observation
is one input ``obs`` (float32 for a float Box, float64 ones such as MuJoCo's included, as the
network takes them; an integer Box keeps its dtype, e.g. uint8 frames); a Dict observation one input per key (``observation``,
``action_mask``, ...; nested keys joined by ``/``); Discrete and MultiDiscrete leaves int64,
MultiBinary and ``action_mask`` int8. The output ``action`` has shape ``[B, *action_shape]``.
A row whose action mask allows nothing gets an arbitrary action (``compute_actions`` raises).

A recurrent policy's module takes its state as one more input, last, ``state_in`` float32[B, S]
(zeros at an episode start), and returns ``(action, state_out)``: feed ``state_out`` back with
the next observation of the same episode. The written file is checked against the policy over a
50-step sequence, the state carried on both sides.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowkit.config import ConfigError
from flowkit.core.encoders import MASK_KEY

FORMATS = ("torchscript", "onnx")
_Leaf = Tuple[str, gym.Space, Tuple[Any, ...]]  # (input name, space, key path into the raw observation)


def _leaves(space: gym.Space, name: str = "obs", path: Tuple[Any, ...] = ()) -> List[_Leaf]:
    """The observation's inputs in the encoder's order; a top-level ``action_mask`` last."""
    if isinstance(space, gym.spaces.Dict):
        out = [lf for k, v in space.spaces.items() if k != MASK_KEY
               for lf in _leaves(v, f"{name}/{k}" if path else str(k), (*path, k))]
        return out + ([(MASK_KEY, space.spaces[MASK_KEY], (MASK_KEY,))] if not path and MASK_KEY in space.spaces
                      else [])
    if isinstance(space, gym.spaces.Tuple):
        return [lf for i, v in enumerate(space.spaces) for lf in _leaves(v, f"{name}/{i}" if path else str(i),
                                                                        (*path, i))]
    return [(name, space, path)]


def _input_dtype(space: gym.Space) -> Any:
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return np.int64
    if isinstance(space, gym.spaces.MultiBinary):
        return np.int8
    if np.issubdtype(space.dtype, np.floating):  # float64 Boxes (MuJoCo) too: the network takes float32,
        return np.float32  # as SB3's and RLlib's exports are fed
    return space.dtype


def input_arrays(space: gym.Space, obs: Any) -> List[np.ndarray]:
    """The exported module's inputs for a batch of raw observations (leading batch axis, as
    a vector env returns them): one array per leaf, in input order, of the input's dtype."""
    out = []
    for _, s, path in _leaves(space):
        x = obs
        for k in path:
            x = x[k]
        out.append(np.ascontiguousarray(x, dtype=_input_dtype(s)))
    return out


def sample_observations(space: gym.Space, n: int, seed: int = 0) -> Any:
    """``n`` raw observations sampled from ``space``, batched as a vector env returns them; an
    ``action_mask`` keeps at least one legal action (its first where the sample had none)."""
    space.seed(seed)
    obs = [space.sample() for _ in range(n)]
    if isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces:
        for o in obs:
            m = o[MASK_KEY] = np.asarray(o[MASK_KEY]).copy()
            if not m.any():
                m.reshape(-1)[0] = 1
    out: Any = gym.vector.utils.create_empty_array(space, n)  # Any: typed Optional, never None here
    return gym.vector.utils.concatenate(space, obs, out)


def run_exported(path: str, fmt: str, inputs: List[np.ndarray]) -> Any:
    """Actions of an exported file for :func:`input_arrays` inputs (ONNX: with onnxruntime;
    ImportError without it); a recurrent policy's file takes the state last and returns
    ``(actions, state_out)``."""
    if fmt == "torchscript":
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is in maintenance mode
            out = torch.jit.load(path)(*[torch.from_numpy(x) for x in inputs])
        return tuple(o.numpy() for o in out) if isinstance(out, tuple) else out.numpy()
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    outs = sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), inputs)})
    return outs[0] if len(outs) == 1 else tuple(outs)


class TorchOps:
    """:class:`flowkit.core.encoders.NumpyOps` in torch ops, for tracing :meth:`ObsEncoder.encode`
    and :meth:`ActionDist.to_env` (the same code the rollout workers run in numpy)."""

    @staticmethod
    def flat(x: torch.Tensor, b: int) -> torch.Tensor:
        return x.float().reshape(b, -1)

    @staticmethod
    def ints(x: torch.Tensor, b: int) -> torch.Tensor:
        return x.long().reshape(b, -1)

    @staticmethod
    def one_hot(i: torch.Tensor, n: int) -> torch.Tensor:
        return nn.functional.one_hot(i, n).float()

    @staticmethod
    def cat(parts: List[torch.Tensor]) -> torch.Tensor:
        return torch.cat(parts, 1)

    @staticmethod
    def cast(x: torch.Tensor, dtype: Any) -> torch.Tensor:
        return x.to(_torch_dtype(dtype))

    @staticmethod
    def const(a: np.ndarray) -> torch.Tensor:  # a constant of the trace, as meant
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return torch.from_numpy(np.array(a))

    @staticmethod
    def clip(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        return torch.minimum(torch.maximum(x, low), high)

    @staticmethod
    def rint(x: torch.Tensor) -> torch.Tensor:
        return torch.round(x)  # half to even, as np.rint

    @staticmethod
    def image(x: torch.Tensor, b: int, shape: Tuple[int, ...], transpose: bool, dtype: Any) -> torch.Tensor:
        x = x.to(_torch_dtype(dtype)).reshape(b, *shape)
        return x.permute(0, 3, 1, 2) if transpose else x


class _ByPath:
    """The exported module's input leaves, indexed like the raw observation (``obs['a'][0]``)."""

    def __init__(self, leaves: Dict[Tuple[Any, ...], torch.Tensor], path: Tuple[Any, ...] = ()):
        self.leaves, self.path = leaves, path

    def __getitem__(self, k: Any) -> Any:
        p = (*self.path, k)
        return self.leaves[p] if p in self.leaves else _ByPath(self.leaves, p)


def encode_inputs(encoder: Any, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """``float32[B, *encoder.shape]``: the :func:`input_arrays` leaves (as tensors) through
    ``encoder``'s own :meth:`~flowkit.core.ObsEncoder.encode` in torch ops."""
    by_path = {path: x for (_, _, path), x in zip(_leaves(encoder.space), inputs)}
    return encoder.encode(by_path[()] if () in by_path else _ByPath(by_path), inputs[0].shape[0], TorchOps)


def _torch_dtype(dtype: Any) -> torch.dtype:
    return getattr(torch, np.dtype(dtype).name)  # float32 -> torch.float32, bool -> torch.bool


class ExportedPolicy(nn.Module):
    """Raw observation leaves -> greedy env actions (see the module docstring).

    ``forward(*inputs) -> action[B, *action_shape]`` (the action space's dtype; int64 for
    Discrete).

    Raises:
        ValueError: the policy has no network to export (the ``random`` policy).
    """

    def __init__(self, policy: Any):
        super().__init__()
        net = policy.action_model()
        if net is None:
            raise ValueError(f"a {type(policy).__name__} has no network to export")
        self.net = copy.deepcopy(net).cpu().eval().requires_grad_(False)
        self.space, self.encoder, dist = policy.observation_space, policy.encoder, policy.dist
        self.leaves = _leaves(self.space)
        self.has_mask = self.encoder.has_mask
        self.dist, self.kind, self.nvec = dist, dist.kind, list(dist.nvec) if hasattr(dist, "nvec") else []
        self.act_space = policy.action_space
        init = policy.initial_state(1) if callable(getattr(policy, "initial_state", None)) else None
        self.state_size = 0 if init is None else int(init.shape[1])  # 0: feed-forward

    def forward(self, *inputs: torch.Tensor) -> Any:
        if self.state_size:  # recurrent: the state is the last input
            *obs_in, state = inputs
            z, state_out = self.net(encode_inputs(self.encoder, obs_in), state)
            return self._act(z, obs_in), state_out
        return self._act(self.net(encode_inputs(self.encoder, inputs)), inputs)

    def _act(self, z: torch.Tensor, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.kind == "cat":
            if self.has_mask:
                z = z.masked_fill(inputs[-1] == 0, torch.finfo(z.dtype).min)
            a = z.argmax(-1)
        elif self.kind == "multicat":
            a = torch.stack([p.argmax(-1) for p in torch.split(z, self.nvec, -1)], -1)
        elif self.kind == "bern":
            a = z > 0
        else:
            a = z[:, :self.dist.dim]
        return self.dist.to_env(a, TorchOps)

    def example_inputs(self, batch: int = 2, seed: int = 0) -> List[np.ndarray]:
        """Inputs for ``batch`` raw observations drawn by :func:`sample_observations` (and a
        recurrent policy's initial state)."""
        obs = input_arrays(self.space, sample_observations(self.space, batch, seed))
        return obs + [np.zeros((batch, self.state_size), np.float32)] if self.state_size else obs

    def signature(self) -> Dict[str, Any]:
        """Input and output names, dtypes and shapes (``B`` the batch axis), as stored with the file."""
        def desc(name, dtype, shape):
            return {"name": name, "dtype": np.dtype(dtype).name, "shape": ["B", *shape]}
        ins = [desc(n, _input_dtype(s), s.shape if s.shape is not None else ()) for n, s, _ in self.leaves]
        out_dtype = np.int64 if self.kind == "cat" else self.act_space.dtype
        outs = [desc("action", out_dtype, self.act_space.shape or ())]
        if self.state_size:
            ins.append(desc("state_in", np.float32, (self.state_size,)))
            outs.append(desc("state_out", np.float32, (self.state_size,)))
        return {"inputs": ins, "outputs": outs, "action_space": str(self.act_space),
                "observation_space": str(self.space), "recurrent_state_size": self.state_size}


def export_policy(policy: Any, fmt: str, path: str, check: int = 256) -> Dict[str, Any]:
    """Write ``policy`` as an :class:`ExportedPolicy` to ``path``: ``torchscript``
    (``torch.jit.trace``; load with ``torch.jit.load``; the signature is the extra file
    ``flowkit.json``) or ``onnx`` (opset 17, dynamic batch axis; the signature is in the
    model's metadata ``flowkit``), then run the written file on ``check`` sampled observations
    against ``policy.compute_actions(obs, explore=False)`` (ONNX: when onnxruntime is
    installed). Returns the signature, with ``checked``: the observations compared (0: none).

    Raises:
        ValueError: an unknown format, a policy without a network, or a file whose actions
            differ from the policy's (a policy that overrides its acting: the file is removed).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r} (use one of {', '.join(FORMATS)})")
    module = ExportedPolicy(policy)
    example = tuple(torch.from_numpy(a) for a in module.example_inputs())
    sig = module.signature()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and exporter notes about the unrolled network
        if fmt == "torchscript":
            traced = torch.jit.trace(module, example, check_trace=False)
            torch.jit.save(traced, path, _extra_files={"flowkit.json": json.dumps(sig)})
        else:
            names, outs = [d["name"] for d in sig["inputs"]], [d["name"] for d in sig["outputs"]]
            torch.onnx.export(module, example, path, dynamo=False, opset_version=17, input_names=names,
                              output_names=outs, dynamic_axes={n: {0: "B"} for n in [*names, *outs]})
            try:
                import onnx
            except ImportError:
                return sig
            model = onnx.load(path)
            model.metadata_props.add(key="flowkit", value=json.dumps(sig))
            onnx.save(model, path)
    sig["checked"] = _check(policy, fmt, path, check) if check else 0
    return sig


def export_checkpoint(path: str, format: str, out: Optional[str] = None, policy: Optional[str] = None,  # noqa: A002
                      trust_config: bool = False) -> Dict[str, Any]:
    """``flowkit export``: policy ``policy`` (None: the run's only one) of the checkpoint at ``path``
    (a run folder: its newest) written by :func:`export_policy` in ``format`` to ``out`` (default
    ``policy[-ID].pt|.onnx`` in the checkpoint's folder; missing folders are made), through a
    temporary file renamed once written and checked: a failure leaves nothing behind. Returns the
    signature with ``out`` (absolute), ``policy`` and ``created``: the top folder made, or None.

    Raises:
        ConfigError: ``out`` cannot be written (a folder, under a file, read-only, a run's own
            file: before any work), ``path`` holds no checkpoint, ``policy`` is not the run's (or
            not named where it has several), or the export failed (one line naming the policy).
    """
    if out:
        from flowkit._outputs import check_output
        check_output(out, "out=")
    from flowkit.checkpoint import find_checkpoint, load_trained
    try:
        ck = find_checkpoint(path)
    except FileNotFoundError as e:  # a folder without checkpoints
        raise ConfigError(str(e)) from None
    algo = load_trained(ck, trust_config=trust_config)
    if policy is None and len(algo.policies) > 1:
        raise ConfigError(f"the run has several policies ({', '.join(algo.policies)}): name one with policy=ID")
    if policy is not None and policy not in algo.policies:
        raise ConfigError(f"policy={policy!r}: the checkpoint has {', '.join(algo.policies)}")
    pid = policy or next(iter(algo.policies))
    out = os.path.abspath(out or os.path.join(ck, f"policy{'-' + pid if len(algo.policies) > 1 else ''}"
                                                  f"{'.pt' if format == 'torchscript' else '.onnx'}"))
    top, parent = None, os.path.dirname(out)
    while parent and not os.path.isdir(parent) and parent != os.path.dirname(parent):  # the top folder to make
        top, parent = parent, os.path.dirname(parent)
    tmp = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.tmp-{os.getpid()}")
    try:
        sig = export_policy(algo.policies[pid], format, tmp)  # makes the missing folders
        os.replace(tmp, out)
    except Exception as e:  # any failure (a module the exporter cannot take, a full disk): one line
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if top:
            shutil.rmtree(top, ignore_errors=True)
        why = (str(e) if isinstance(e, ValueError) else
               f"cannot write it as {format}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")
        raise ConfigError(f"policy {pid!r}: {why.replace(tmp, out)}") from None
    return {**sig, "out": out, "policy": pid, "created": top}


def _differ(got: np.ndarray, want: np.ndarray, n: int) -> int:
    """Rows (of ``n``) where the exported actions ``got`` differ from the policy's ``want``."""
    close = np.isclose(got, want, rtol=1e-4, atol=1e-4) if np.issubdtype(want.dtype, np.floating) else got == want
    return int((~close.reshape(n, -1).all(1)).sum()) if got.shape == want.shape else n


def _check(policy: Any, fmt: str, path: str, n: int) -> int:
    if callable(getattr(policy, "initial_state", None)) and policy.initial_state(1) is not None:
        return _check_sequence(policy, fmt, path, max(1, n // SEQUENCE_STEPS))
    obs = sample_observations(policy.observation_space, n, seed=1)
    want = policy.compute_actions(obs, explore=False)
    try:
        got = run_exported(path, fmt, input_arrays(policy.observation_space, obs))
    except ImportError:
        return 0
    if bad := _differ(got, want, n):
        os.remove(path)
        raise ValueError(f"the exported module's actions differ from compute_actions(obs, explore=False) on {bad} "
                         f"of {n} sampled observations (does the policy override its acting?); {path} not kept")
    return n


SEQUENCE_STEPS = 50  # a recurrent policy's export is checked over sequences of this many steps


def _check_sequence(policy: Any, fmt: str, path: str, rows: int) -> int:
    """A recurrent policy's file against ``compute_actions(obs, explore=False, state=...)`` over
    ``rows`` sequences of :data:`SEQUENCE_STEPS` sampled observations, each side carrying its
    own state; returns the observations compared."""
    want_s, got_s = policy.initial_state(rows), policy.initial_state(rows)
    for t in range(SEQUENCE_STEPS):
        obs = sample_observations(policy.observation_space, rows, seed=1 + t)
        want, want_s = policy.compute_actions(obs, explore=False, state=want_s)
        try:
            got, got_s = run_exported(path, fmt, [*input_arrays(policy.observation_space, obs), got_s])
        except ImportError:
            return 0
        bad = _differ(got, want, rows) or (rows if not np.allclose(got_s, want_s, rtol=1e-4, atol=1e-4) else 0)
        if bad:
            os.remove(path)
            raise ValueError(f"the exported module's actions or state differ from compute_actions(obs, explore=False, "
                             f"state=...) at step {t} of a {SEQUENCE_STEPS}-step sequence ({bad} of {rows} rows); "
                             f"{path} not kept")
    return rows * SEQUENCE_STEPS


__all__ = ["FORMATS", "ExportedPolicy", "export_policy", "input_arrays", "run_exported", "sample_observations"]
