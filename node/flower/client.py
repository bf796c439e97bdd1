"""A client actor that runs a Flower ClientApp: on a task it rebuilds the Flower Message and the
node's Context (node id, node config with its partition id, state kept across rounds), calls the
app, charges the emulated compute time from its device model for the samples the app reports,
and sends the reply's arrays back through the upload codec."""
from __future__ import annotations

import logging
import random
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol.codecs import Codec
from ..actor import Message as Delivery, Reaction, Send
from ..channel import Channel
from ..client import ClientProfile
from ..compute import full_speed_seconds
from .app import FlowerAppRef, load_component
from .records import decode_content, encode_content
from .identity import NODE_ID_BASE, RUN_ID, SUPERLINK_NODE_ID, set_task_identity


@dataclass
class FlowerClientConfig:
    app: FlowerAppRef
    up_codec: Codec
    seed: int
    num_partitions: int
    epochs: int = 1  # passes the app makes over the samples it reports (for the compute charge)
    batch_size: int = 32
    samples_metric: str = "num-examples"
    samples: int | None = None  # charged when a reply reports no samples; None: the client's own count
    log_level: str = "WARNING"  # Flower's logger in this process
    checkin: bool = False  # say so to the server when the device comes online (and with every reply)


class FlowerClientActor:
    def __init__(self, profile: ClientProfile, cfg: FlowerClientConfig, client_app: Any):
        from flwr.app import Context, RecordDict  # noqa: PLC0415

        self.name = profile.name
        self.profile = profile
        self.cfg = cfg
        self.app = client_app
        self.node_id = NODE_ID_BASE + profile.index
        self.context = Context(run_id=RUN_ID, node_id=self.node_id,
                               node_config={"partition-id": profile.index, "num-partitions": cfg.num_partitions},
                               state=RecordDict(), run_config=dict(cfg.app.run_config))
        self.up = Channel(cfg.up_codec, side="client")

    def react(self, msg: Delivery) -> Reaction:
        if msg.kind == "online" and self.cfg.checkin:
            return Reaction(sends=[Send("server", "checkin", -1, self.profile.status(msg.device))])
        if msg.kind != "task" or "flower" not in msg.body:
            return Reaction()
        head = msg.body["flower"]
        rng = np.random.default_rng([self.cfg.seed, msg.round, self.profile.index, 0xF1])

        def run_app():
            """The app in wall time; the emulated time it costs is known only from what it reports,
            so it is charged after (from the task's instant, which the clock has not left)."""
            reply_head: dict[str, Any] = {"reply_to": head["id"], "type": head["type"], "ttl": head["ttl"],
                                          **({"status": self.profile.status(msg.device)} if self.cfg.checkin else {})}
            frames: list = []
            payload = fp32 = 0
            samples = None
            try:
                message = self._message(head, msg.frames)
                self._seed(msg.round)
                set_task_identity(self.node_id)
                reply = self.app(message, self.context)
                if reply.has_error():
                    reply_head["error"] = f"{reply.error.code}: {reply.error.reason}"
                else:
                    wire = encode_content(reply.content, self.up, rng)
                    wire.commit()
                    reply_head["content"], frames = wire.body, wire.frames
                    payload, fp32 = wire.payload_bytes, wire.fp32_bytes
                    metrics = {k: v for r in reply.content.metric_records.values() for k, v in r.items()}
                    samples = metrics.get(self.cfg.samples_metric)
            except Exception:  # the app's failure is its reply, as Flower's runtime makes it
                traceback.print_exc()
                reply_head["error"] = traceback.format_exc(limit=3)
            if not isinstance(samples, (int, float)):
                samples = self.cfg.samples if self.cfg.samples is not None else int(self.profile.indices.size)
            busy = full_speed_seconds(self.profile.ms_per_sample, int(samples), self.cfg.epochs, self.cfg.batch_size,
                                      self.profile.ms_per_batch) if not reply_head.get("error") else 0.0
            send = Send("server", "update", msg.round, {"flower": reply_head}, frames, payload, fp32)
            return lambda: Reaction(work_s=self.profile.duration(busy, msg.t, msg.device), busy_s=busy,
                                    work=lambda: Reaction(sends=[send]))

        return Reaction(work=run_app)

    def _message(self, head: dict[str, Any], frames) -> Any:
        from flwr.app import Message  # noqa: PLC0415
        from flwr.app.metadata import Metadata  # noqa: PLC0415

        metadata = Metadata(run_id=RUN_ID, message_id=str(head["id"]), src_node_id=SUPERLINK_NODE_ID,
                            dst_node_id=self.node_id, reply_to_message_id="", group_id=str(head["group"]),
                            created_at=time.time(), ttl=float(head["ttl"]), message_type=str(head["type"]))
        return Message(metadata=metadata, content=decode_content(head["content"], frames))

    def _seed(self, round_: int) -> None:
        """Apps train with torch's and numpy's global generators: seeded per client and round."""
        import torch  # noqa: PLC0415

        seed = int(np.random.SeedSequence([self.cfg.seed, round_, self.profile.index]).generate_state(1)[0])
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)


def make_client_actors(profiles: list[ClientProfile], cfg: FlowerClientConfig) -> list[FlowerClientActor]:
    logging.getLogger("flwr").setLevel(cfg.log_level)
    app = load_component(cfg.app, "client")
    return [FlowerClientActor(p, cfg, app) for p in profiles]
