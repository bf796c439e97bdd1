"""The client actor: receive the global model, declare the modelled training time, train for
real (with the core paper's local DP when configured), send the model back with this round's
bit-length. The order is Algorithm 1 of docs/algorithms.md 1.1: dequantize, train with clipping,
add noise to the weights, quantize, upload."""
from __future__ import annotations

import logging
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from protocol.codecs import Codec, CodecError, ErrorFeedback
from .channel import Channel, ChannelStats, decode_with_extras
from .cohort import CohortTrainer, TrainRequest, resolve_cohort
from . import accounting
from .actor import Checkpointable, Message, Reaction, Send
from .codec_cost import CodecTime
from .compute import LoadModel, full_speed_seconds, loaded_duration
from .data import Dataset, with_input_noise
from .device import DevicePlan
from .models import build_model, state_spec
from .schedule import BitSchedule, importance
from .secure.client import CLIENT_KINDS, SecureClient
from .stages import Privacy, privacy_stage
from .strategies import Strategy
from .strategies.base import ClientStep, SessionPlan
from .strategies.fedavg import FedAvg
from .training import LocalTraining, TrainingResult, steps_per_epoch

log = logging.getLogger(__name__)


@dataclass
class ClientProfile:
    name: str
    index: int
    indices: np.ndarray  # the client's training samples
    ms_per_sample: float  # modelled compute speed of its device
    test_indices: np.ndarray | None = None  # its own test split, where the algorithm evaluates per client
    input_noise: float = 0.0  # std of the fixed Gaussian noise on its training inputs (feature skew)
    ms_per_batch: float = 0.0  # modelled fixed cost of one training step of its device
    aggregator: str = "server"  # who it checks in with and sends its updates to (its edge, in a hierarchy)

    def status(self, device: dict | None) -> dict:
        """What the client tells its server about itself: its device's state (as the network gave
        it with a delivery) plus its data size and speed."""
        return {**(device or {}), "samples": int(self.indices.size), "ms_per_sample": self.ms_per_sample}

    def duration(self, busy_s: float, t: float, device: dict | None) -> float:
        """Emulated seconds for busy_s of full-speed compute begun at t, under the device's background
        load period by period (the load the device reported when no process is given)."""
        device = device or {}
        return loaded_duration(busy_s, t, LoadModel.from_status(device), float(device.get("cpu_load", 0.0)))

    def training_data(self, train: Dataset, seed: int) -> tuple[Dataset, np.ndarray]:
        """The data this client trains on and its indices there: the shared training set, or its own
        noisy copy under feature skew (the same noise for every algorithm and run)."""
        return with_input_noise(train, self.indices, self.input_noise, [seed, self.index, 0xF5])


@dataclass
class TaskSpec:
    model: str
    train: Dataset
    test: Dataset
    seed: int
    plan: DevicePlan = field(default_factory=DevicePlan)  # where hosts train (resolved in each host)
    device: str = "cpu"  # where this process's models and data live, once resolved
    model_options: dict[str, Any] = field(default_factory=dict)  # a user's model factory's keyword arguments

    def build(self, seed: int | None = None) -> torch.nn.Module:
        model = build_model(self.model, self.train.input_shape, self.train.classes, seed=self.seed if seed is None else seed,
                            options=self.model_options)
        return model.to(self.device) if self.device != "cpu" else model

    def on(self, device: str) -> "TaskSpec":
        """This task with its data and every model it builds on `device`."""
        if device == self.device:
            return self
        return dataclasses.replace(self, train=self.train.to(device), test=self.test.to(device), device=device)


@dataclass
class ClientConfig:
    up_codec: Codec
    seed: int
    schedule: BitSchedule = field(default_factory=BitSchedule)
    lambda_h: float = 0.5
    privacy: Privacy = field(default_factory=Privacy)
    train: bool = True  # False: communication only, the received model goes back re-encoded
    shuffle: str = "every_epoch"
    checkin: bool = False  # check in with the server whenever the device comes online
    error_feedback: bool = False  # keep the upload's compression residual (lost when the device goes offline)
    max_samples: int | None = None  # train on at most this many samples per round (a fresh seeded subset)
    up_layers: dict[str, Codec] = field(default_factory=dict)  # mixed precision: tensor name -> its own codec
    strategy: Strategy = field(default_factory=FedAvg)  # its client side: how the global model becomes this client's
    cohort: str | int = "auto"  # algorithm.cohort: the largest group of clients a host trains together
    codec_time: CodecTime | None = None  # algorithm.charge_codec_time: the host's measured codec seconds
    # statistics the selection policy needs in every update's body (Oort: loss_rms); nothing else of
    # the session's diagnostics crosses the wire
    update_statistics: tuple[str, ...] = ()
    secure: SecureClient | None = None  # algorithm.secure_aggregation: the client half of its phases


class Trainer:
    """One model instance shared by every client actor of a host: they train one at a time, or
    together in cohorts (node/cohort.py) when the runtime runs their work as a group."""

    def __init__(self, task: TaskSpec, cohort: str | int = "off"):
        self.task = task
        self.model = task.build()
        self.spec = state_spec(self.model)
        self.cohorts = CohortTrainer(self.model, resolve_cohort(cohort, self.model, task.device))

    def train(self, state, indices, cfg: LocalTraining, rng, fixed_order=None, data: Dataset | None = None,
              correction: dict[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], TrainingResult]:
        return self.cohorts.train(TrainRequest(state, data or self.task.train, indices, cfg, rng, fixed_order, correction))


class ClientActor(Checkpointable):
    STATE = ("rejected", "generation", "pending", "feedback", "rdp_spent", "closed_through", "strategy_state")

    def __init__(self, profile: ClientProfile, trainer: Trainer, cfg: ClientConfig):
        self.name = profile.name
        self.profile = profile
        self.trainer = trainer
        self.cfg = cfg
        self.rejected = 0
        self.generation = 0  # bumped when the device comes back online: work begun before is lost
        self.pending: dict[int, tuple[Message, Any]] = {}  # round -> a task its strategy's client half holds back (FedAlign)
        self.feedback = ErrorFeedback() if cfg.error_feedback else None
        self.up_stats = ChannelStats()
        self.rdp_spent: tuple[float, ...] | None = None  # the RDP curve of every release this client sent
        self.closed_through = -1  # the server said its rounds up to this one closed (round.notify_closed)
        # the strategy's own state for this client (SCAFFOLD's c_i); None until its first update
        # leaves, so that an idle client of a large population holds nothing for it
        self.strategy_state: dict | None = None
        self.secure_round = None  # secure aggregation's keys and shares of the round in progress (node/secure/client.py)

    # What training reads is made at the first task that needs it: an idle client of a large
    # population is its profile and a few counters, not arrays of its own.
    @functools.cached_property
    def _local_data(self) -> tuple[Dataset, np.ndarray]:
        return self.profile.training_data(self.trainer.task.train, self.cfg.seed)

    @property
    def data(self) -> Dataset:
        return self._local_data[0]

    @property
    def indices(self) -> np.ndarray:
        return self._local_data[1]

    @functools.cached_property
    def labels(self) -> np.ndarray:
        return self.data.y.cpu().numpy()[self.indices]

    @functools.cached_property
    def fixed_order(self) -> np.ndarray:
        return np.random.default_rng([self.cfg.seed, self.profile.index]).permutation(self.indices)

    def reject(self, msg: Message, error: str) -> Reaction:
        self.rejected += 1
        log.warning("[%s] rejected task of round %s: %s", self.name, msg.round, error)
        return Reaction(reports=[{"type": "rejected", "actor": self.name, "round": msg.round, "error": error}])

    def upload_channel(self) -> Channel:
        """The upload channel of the configuration in force; the error-feedback memory and the
        statistics are the client's and outlive it."""
        c = self.cfg
        return Channel(c.up_codec, layers=c.up_layers, schedule=c.schedule, side="client", feedback=self.feedback,
                       stats=self.up_stats)

    def react(self, msg: Message) -> Reaction:
        if msg.kind == "online":
            self.generation += 1
            if self.feedback:  # the OS ended the app while the device was away: its memory is gone
                self.feedback.reset()
            if self.cfg.checkin:
                return Reaction(sends=[Send(self.profile.aggregator, "checkin", -1, self.profile.status(msg.device))])
            return Reaction()
        if msg.kind == "closed":
            self.closed_through = max(self.closed_through, msg.round)
            self.pending.pop(msg.round, None)
            return Reaction()
        if msg.kind == "task":
            if msg.round <= self.closed_through:
                return Reaction()  # its round closed before the task got here: nothing to do
            if self.cfg.secure is not None and "secure" in msg.body:
                return self.cfg.secure.on_task(self, msg)
            own = self.cfg.strategy.client_on_task(self, msg)
            return own if own is not None else self.train_task(msg, msg)
        if self.cfg.secure is not None and msg.kind in CLIENT_KINDS:
            return self.cfg.secure.on_message(self, msg) or Reaction()
        if msg.kind in self.cfg.strategy.client_message_kinds:
            return self.cfg.strategy.client_on_message(self, msg) or Reaction()
        return Reaction()

    def _local_training(self, body: dict) -> tuple[Any, LocalTraining]:
        """The privacy stage and the local schedule a task asks for."""
        dp = privacy_stage(self.cfg.privacy)
        return dp, dp.training(LocalTraining(int(body["epochs"]), int(body["batch_size"]), float(body["lr"]),
                                             shuffle=self.cfg.shuffle))

    def _task_rng(self, round_: int) -> np.random.Generator:
        return np.random.default_rng([self.cfg.seed, round_, self.profile.index])

    def _full_speed_seconds(self, samples: int, epochs: int, batch_size: int) -> float:
        """A session's training time on this client's device, unloaded."""
        return full_speed_seconds(self.profile.ms_per_sample, samples, epochs, batch_size, self.profile.ms_per_batch)

    def train_task(self, task: Message, now: Message, plan: SessionPlan | None = None) -> Reaction:
        """Train on the task's model and send the update, `now` (the task, or the message that let
        it go on); `plan` is how the strategy's client half shapes the session."""
        plan = plan or SessionPlan()
        body = task.body
        dp, local = self._local_training(body)
        samples = int(self.profile.indices.size)
        session, session_order = self._session(task.round)
        trained_on = int(session.size) if plan.indices is None else int(plan.indices.size)
        if plan.indices is None and session.size < samples:
            session, session_order, local = self._capped(session, session_order, local)
        rng = self._task_rng(task.round)
        nu = self._importance(int(body.get("n_max", samples)))
        up = self.upload_channel()
        bits = up.bits(task.round, nu)
        generation = self.generation
        status = self.profile.status(now.device)

        def work():
            if generation != self.generation:
                return Reaction()  # the device went off and on while this task waited: it died with it
            if task.round <= self.closed_through:
                # Told that the round closed before this session's real computation began: nothing it
                # computes would leave the device. It still answers at its ready time, as a session
                # that trained does, so the run is the same whichever thread got here first.
                return lambda: Reaction()
            # Decoded only now: a host may hold tasks for dozens of clients waiting their turn, and the
            # encoded frames are several times smaller than the dequantized float32 model.
            try:
                state, extras = self._decode_task(task)
            except CodecError as exc:
                return self.reject(task, str(exc))
            # What the update's body carries: the aggregation weight (what it trained on: all its samples
            # unless its session is capped) and the bit-length the payload is decoded with. Everything
            # else the session learns of its data (loss, nu, lambda, noise, epsilon) goes to `info`, the
            # run's records, and never crosses the wire (a real deployment's server would see it).
            body = {"samples": trained_on if plan.weight is None else plan.weight, "bits": bits, **plan.body}
            info = {"nu": nu, **{key: body.pop(key) for key in plan.hidden}}
            if self.cfg.checkin:
                body["status"] = status
            data, indices, order = self.data, session, session_order
            if plan.indices is not None:
                data = plan.data() if callable(plan.data) else plan.data if plan.data is not None else self.data
                indices, order = plan.indices, None
            step, release = self._trained(state, extras, info, dp, local, rng, indices, order, data, task.body)
            if plan.upload is not None:
                out, own_release = plan.upload(state, step.state, local, indices, rng, info, up, bits, step.extras)
                release = own_release or release
            else:
                out = up.encode(step.state, rng, bits=bits, reference=state, delta=self.cfg.strategy.uploads_delta,
                                extras=step.extras)
            if out.extras_from is not None:
                body["extras_from"] = out.extras_from
            for key in self.cfg.update_statistics:  # what the selection policy asks of every update (Oort's utility)
                body[key] = info.get(key)
            encoded = out.encoded
            update = Send(self.profile.aggregator, plan.kind, task.round, body, encoded.frames, encoded.payload_bytes,
                          encoded.fp32_bytes, notes=info)

            def deliver() -> Reaction:  # runs at ready_at, after everything that reached this client before
                if generation != self.generation:
                    return Reaction()  # the device went off and on meanwhile: this work died with it
                if task.round <= self.closed_through:
                    return Reaction()  # the server closed the round meanwhile: the update stays here
                out.commit()
                if step.client_state is not None:
                    self.strategy_state = step.client_state
                if release:
                    self.rdp_spent = self._spent_with(release)
                return Reaction(sends=[update], reports=[self.released(task.round, release)] if release else [])

            return deliver

        # the mechanism's own cost: DP-SGD's per-sample gradients make a session several times longer
        busy = self._full_speed_seconds(trained_on, local.epochs, local.batch_size) * self.cfg.privacy.compute_factor + plan.busy_s
        if self.cfg.codec_time is not None:
            busy += self.cfg.codec_time.seconds(body.get("bits"), bits, self.profile.ms_per_sample)
        return Reaction(work_s=self.profile.duration(busy, now.t, now.device), busy_s=busy, work=work,
                        cohort=self.cfg.train)

    def _decode_task(self, task: Message) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The task's model (weights) and the arrays its strategy sends beside it."""
        state, basis, extras = decode_with_extras(task.frames, task.body.get("extras_from"), self.trainer.spec,
                                                  self.cfg.strategy.extras_spec(self.trainer.spec, "down"), "task")
        if basis != "weights":
            raise CodecError("task must carry weights")
        return state, extras

    def _trained(self, state, extras, info: dict, dp, local: LocalTraining, rng, indices, order, data, task_body: dict):
        """The strategy's client step on this session, with the privacy stage after it and the
        strategy's own release (user-level DP's clip and noise) last: (ClientStep, the privacy
        release or None)."""
        if not self.cfg.train:
            return ClientStep(state, None), None
        step = self.cfg.strategy.client_step(
            state, local, lambda start, config, correction=None: self.trainer.train(
                start, indices, config, rng, order, data, correction), extras,
            self.cfg.strategy.client_state() if self.strategy_state is None else self.strategy_state)
        result = step.result
        info["loss"], info["loss_rms"] = result.loss, result.loss_rms
        step.state, release = dp.privatize(step.state, result, local, rng, info)
        if release is not None and release.mechanism == "dpsgd":  # DP-SGD: its epsilon so far, with this round
            spent = self._spent_with(release)
            info["dp_epsilon_total"] = accounting.rdp_epsilon(spent, self.cfg.privacy.accounting_delta)[0]
        step.state, own = self.cfg.strategy.client_release(state, step.state, task_body, rng, info)
        return step, own or release

    def _session(self, round_: int) -> tuple[np.ndarray, np.ndarray]:
        """The samples of this round's training session and their fixed batch order: all of them, or
        a fresh seeded subset of max_samples (a device trains for a bounded session, and a client with
        thousands of samples would otherwise outweigh and outrun the rest)."""
        cap = self.cfg.max_samples
        if not cap or self.indices.size <= cap:
            return self.indices, self.fixed_order
        pick = np.random.default_rng([self.cfg.seed, round_, self.profile.index, 0x5E]).choice(self.indices.size, cap, replace=False)
        chosen = np.sort(self.indices[pick])
        return chosen, self.fixed_order[np.isin(self.fixed_order, chosen)]

    def _importance(self, n_max: int) -> float:
        """Eq. 1.7's nu_i under the dynamic schedule (n_max over the round's selected clients); 1 otherwise."""
        if self.cfg.schedule.kind != "dynamic":
            return 1.0
        return importance(self.labels, self.data.classes, int(self.profile.indices.size), n_max, self.cfg.lambda_h)

    def _capped(self, session: np.ndarray, order: np.ndarray, local: LocalTraining):
        """A capped session as it trains: its subset, except under DP-SGD with Poisson sampling, where
        its ceil(cap/B) steps an epoch draw their batches from all the client's samples at rate B/n:
        the cap's work in expectation, and the add/remove bound holds. Batches of a fixed-size subset
        would make neighbouring data sets differ by substitution."""
        if local.dpsgd is None or local.dpsgd.sampling != "poisson":
            return session, order, local
        steps = steps_per_epoch(int(session.size), local.batch_size)
        local = dataclasses.replace(local, dpsgd=dataclasses.replace(local.dpsgd, steps=steps))
        return self.indices, self.fixed_order, local

    def _spent_with(self, release: accounting.Release) -> tuple[float, ...]:
        """This client's RDP curve with one more release (RDP composes by adding, order by order)."""
        curve = release.rdp_curve()
        return curve if self.rdp_spent is None else tuple(a + b for a, b in zip(self.rdp_spent, curve))

    def released(self, round_: int, release: accounting.Release) -> dict:
        """A report for the run's privacy ledger: this client sent a noised message."""
        return {"type": "privacy", "actor": self.name, "round": round_, **dataclasses.asdict(release)}
