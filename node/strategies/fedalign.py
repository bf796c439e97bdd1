"""FedAlign, both halves (docs/algorithms.md part 3): before training, every selected client sends
the noised moments of its unsampled data; when all are in, the server sends their aggregate
back, and the clients train on data aligned to it and upload a clipped, noised pseudo-gradient.
Updates then combine as FedAvg's, with the server step eta of Eq. 3.7. The arithmetic is
node/fedalign.py's."""
from __future__ import annotations

from typing import Literal, Optional

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from protocol.codecs import CodecError, decode_state, encode_state
from .. import accounting, fedalign
from ..actor import Reaction, Send
from ..data import Dataset
from .base import Capabilities, RoundControl, SessionPlan, register
from .fedavg import FedAvg


@register("fedalign")
class FedAlign(FedAvg):
    options_key = "fedalign"  # its options live under algorithm.fedalign
    message_kinds = ("stats",)
    client_message_kinds = ("moments",)
    capabilities = Capabilities(
        privacy=("none",), error_feedback=False,
        privacy_why="algorithm.privacy is the core paper's local DP; FedAlign has its own: algorithm.fedalign.clip, epsilon")

    class Options(FedAvg.Options):
        """FedAlign (docs/algorithms.md part 3). The paper's values were not recovered; these defaults are ours."""
        sample_fraction: float = Field(0.8, gt=0, lt=1, description="|S_k|/|D_k|: share of a client's data trained on each round")
        rho: float = Field(1.0, gt=0, le=1, description="share of the unsampled part U_k used for the statistics")
        granularity: Literal["channel", "dimension"] = Field("channel", description="moments per colour channel or per input dimension")
        moments: Literal[2, 4] = Field(2, description="2: align mean and variance; 4: also skewness and kurtosis (Cornish-Fisher step)")
        stat_clip: float = Field(10.0, gt=0, description="S_stat: the skewness and kurtosis derived from the noised raw moments are clamped to [-S, S]")
        input_range: list[float] = Field(
            default_factory=lambda: [0.0, 1.0], min_length=2, max_length=2,
            description="inputs are clamped to [low, high] before the statistics: what bounds one sample's influence (their DP sensitivity)")
        stat_epsilon: Optional[float] = Field(None, gt=0, description="DP budget of the statistics; null: no noise")
        stat_delta: float = Field(1e-5, gt=0, lt=1)
        clip: Optional[float] = Field(None, gt=0, description="C: L2 clip of the pseudo-gradient (Eq. 3.6); null: no clipping")
        epsilon: Optional[float] = Field(None, gt=0, description="DP budget of the update; needs clip; null: no noise")
        delta: float = Field(1e-5, gt=0, lt=1)

        @field_validator("input_range")
        @classmethod
        def _range(cls, v):
            if not v[0] < v[1]:
                raise ValueError(f"input_range must be [low, high] with low < high, got {v}")
            return v

        @model_validator(mode="after")
        def _noise_needs_clip(self):
            if self.epsilon is not None and self.clip is None:
                raise ValueError("epsilon needs clip: the Gaussian noise is calibrated to the clip bound C")
            return self

    def __init__(self, options=None, *, seed: int = 0):
        super().__init__(options, seed=seed)
        o = self.options
        self.config = fedalign.FedAlignConfig(o.sample_fraction, o.rho, o.granularity, o.moments, o.stat_clip,
                                              tuple(o.input_range), o.stat_epsilon, o.stat_delta, o.clip, o.epsilon, o.delta)
        self.stats_waiting: set[str] = set()  # clients whose moments are still due this round
        self.stats: dict[str, tuple[dict, float]] = {}

    def configure_round(self, control: RoundControl, global_state):
        self.stats_waiting = set(control.selected)
        self.stats = {}
        return {}

    def waiting_for(self) -> set[str]:
        return self.stats_waiting

    def on_message(self, msg, control: RoundControl) -> list:
        """Step 3: once every selected client's moments are in, broadcast their aggregate."""
        if msg.src not in self.stats_waiting:
            return []
        self.stats_waiting.discard(msg.src)
        try:
            raw, _ = decode_state(msg.frames)
            wanted = fedalign.RAW[: self.config.moments]
            if sorted(raw) != sorted(wanted) or len({v.shape for v in raw.values()}) != 1:
                raise CodecError(f"statistics must be {wanted} of one shape, got "
                                 f"{ {k: v.shape for k, v in raw.items()} }")
            stats = fedalign.central_moments(raw, self.config.stat_clip)
        except CodecError as exc:
            control.reject(msg.src, "statistics", str(exc))
        else:
            self.stats[msg.src] = (stats, float(msg.body.get("samples", 1)))
        return self._maybe_send_moments(control)

    def on_lost(self, clients: set[str], control: RoundControl) -> list:
        if not self.stats_waiting & clients:
            return []
        self.stats_waiting -= clients
        for name in clients:
            self.stats.pop(name, None)
        return self._maybe_send_moments(control)

    def _maybe_send_moments(self, control: RoundControl) -> list:
        if self.stats_waiting or not self.stats:
            return []
        shapes = {name: m["mean"].shape for name, (m, _) in self.stats.items()}
        common = max(sorted(set(shapes.values())), key=list(shapes.values()).count)
        for name in sorted(n for n, shape in shapes.items() if shape != common):  # cannot be averaged with the rest
            del self.stats[name]
            control.reject(name, "statistics", f"shape {shapes[name]}, the others {common}")
        target = fedalign.aggregate_moments(list(self.stats.values()))
        encoded = encode_state(target, fedalign.MOMENTS_CODEC, np.random.default_rng([control.seed, control.index, 0xA1]))
        to = sorted(self.stats)
        self.stats = {}
        return [Send(to, "moments", control.index, {}, encoded.frames, encoded.payload_bytes, encoded.fp32_bytes)]

    # ---- client half (docs/algorithms.md 3.1) ---------------------------------------------------
    def client_on_task(self, client, task) -> Reaction:
        """Step 2: moments of this round's unsampled data, clipped and noised, to the server. The
        task waits in client.pending for the global moments. Their computation is not given
        emulated time (one pass over a few thousand inputs, against epochs of training)."""
        fa = self.config
        rng = np.random.default_rng([client.cfg.seed, task.round, client.profile.index, 0xA1])
        sampled, unsampled = fedalign.split_round(client.indices, fa, rng)
        x, _ = client.data.batch(torch.from_numpy(unsampled))
        low, high = fa.input_range
        raw = fedalign.raw_moments(x.cpu().numpy(), fa.granularity, fa.moments, low, high)
        stats = fedalign.privatize_moments(raw, fedalign.raw_moment_ranges(low, high, fa.moments),
                                           int(unsampled.size), fa.stat_epsilon, fa.stat_delta, rng)
        encoded = encode_state(stats.raw, fedalign.MOMENTS_CODEC, rng)
        client.pending = {task.round: (task, sampled)}  # an older round's task is abandoned
        reports = []
        if stats.sigma > 0:
            release = accounting.gaussian_release("statistics", stats.sigma, stats.sensitivity, fa.stat_epsilon, fa.stat_delta)
            reports.append(client.released(task.round, release))
        return Reaction(sends=[Send(client.profile.aggregator, "stats", task.round, {"samples": int(client.profile.indices.size)},
                                    encoded.frames, encoded.payload_bytes, encoded.fp32_bytes)], reports=reports)

    def client_on_message(self, client, msg) -> Reaction | None:
        """Step 4: the global moments are in: train on S_k aligned to them, weighted by all of the
        client's samples, and upload the private pseudo-gradient."""
        task, sampled = client.pending.pop(msg.round, (None, None))
        if task is None:
            return None
        try:
            wanted = fedalign.MOMENTS[: self.config.moments]
            target, _ = decode_state(msg.frames, {k: ((self._moment_size(client.data),), "f4") for k in wanted})
        except CodecError as exc:
            return client.reject(msg, f"global moments: {exc}")
        plan = SessionPlan(indices=np.arange(sampled.size), data=lambda: self._aligned(client.data, sampled, target),
                           weight=int(client.profile.indices.size), upload=self._private_upload)
        return client.train_task(task, msg, plan)

    def _moment_size(self, data: Dataset) -> int:
        shape = data.input_shape
        return int(shape[0]) if self.config.granularity == "channel" else int(np.prod(shape))

    def _aligned(self, data: Dataset, sampled: np.ndarray, target: dict[str, np.ndarray]) -> Dataset:
        """S_k' = Align(S_k; global moments), as float inputs in the same [0, 1] scale as the rest."""
        x, y = data.batch(torch.from_numpy(sampled))
        fa = self.config
        aligned = fedalign.align(x.cpu().numpy(), target, fa.granularity, higher=fa.moments == 4)
        return Dataset(torch.from_numpy(aligned).to(y.device), y, data.classes)

    def _private_upload(self, state, new_state, local, indices, rng, info: dict, up, bits, _extras=None):
        """FedAlign's update: the clipped, noised pseudo-gradient as a delta (Eq. 3.5-3.6)."""
        steps = local.epochs * -(-int(indices.size) // local.batch_size)
        fa = self.config
        update = fedalign.private_update(state, new_state, local.lr * steps, fa.clip, fa.epsilon, fa.delta, rng)
        info.update(noise_scale=update.noise_scale, update_norm=update.norm)
        release = None
        if update.noise_scale > 0:
            release = accounting.gaussian_release("update", update.noise_scale, 2.0 * fa.clip, fa.epsilon, fa.delta)
        return up.encode(update.delta, rng, bits=bits, is_delta=True), release
