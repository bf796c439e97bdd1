"""The server actor's part in secure aggregation: it hands the round's messages, timers, losses
and deadline to the round's SecureRound (node/secure/server.py) and carries out its Steps, ending
the round with the sum (or the failure) in place of the clients' updates. A mixin of ServerActor
(node/server.py), apart so that the actor reads as FedAvg's round."""
from __future__ import annotations

from typing import Any

from ..actor import Message, Reaction
from ..strategies.base import Difference
from . import vector as secure_vector
from .server import SecureRound, Step


class SecureRounds:
    """Needs the ServerActor's round, secure, cfg, spec, global_state, strategy, _reported_back and _close."""

    def _on_secure(self, msg: Message) -> Reaction:
        if msg.kind == "sa_masked":
            self._reported_back(msg)
        if self.secure is None or self.round is None or msg.kind != "tick" and msg.round != self.round.index:
            return Reaction()  # a message of an earlier round (a timer names its round in its tag)
        step = self.secure.on_timer(msg.body["tag"], msg.t) if msg.kind == "tick" else self.secure.on_message(msg)
        return self._secure_step(step, msg.t)

    def _secure_step(self, step: Step, t: float) -> Reaction:
        """Carry out what the secure round asks: its sends and timers; or the round's end, failed or
        with the sum, which is unmasked for real off the actor's thread in the emulated time the
        cost model gives."""
        rnd, secure = self.round, self.secure
        if step.failed:
            return self._secure_close(rnd, secure, t, [], step.reports)
        if step.compute is None:
            return Reaction(sends=step.sends, timers=step.timers, reports=step.reports)
        t_sum = t + step.work_s

        def work():
            summed = step.compute()

            def done() -> Reaction:
                if summed is None:
                    failed = secure._failed(len(secure.contributors), t_sum, "a secret the sum needs does not rebuild")
                    return self._secure_close(rnd, secure, t_sum, [], step.reports + failed.reports)
                total, count, notes = summed
                state, weight, sums = secure_vector.decode_mean(total, self.cfg.secure.clip, self.cfg.secure.bits, count,
                                                                self.spec, self.global_state, secure.extras)
                self.strategy.on_secure_sum(state, Difference(state, self.global_state), weight, count, sums)
                return self._secure_close(rnd, secure, t_sum, secure.contributors, step.reports + notes)

            return done

        return Reaction(work_s=step.work_s, work=work)

    def _secure_close(self, rnd: Any, secure: SecureRound, t: float, contributors: list[str],
                      reports: list[dict]) -> Reaction:
        """The secure round's end: who contributed, who dropped out in which phase, and the phases'
        times in the round's report."""
        self.secure = None
        rnd.completed = list(contributors)
        for name in rnd.selected:
            if name in contributors:
                rnd.clients[name] = {"outcome": "ok", "samples": None, "bits": secure.word_bits}  # samples: the notes'
            else:
                rnd.clients[name] = {"outcome": "rejected" if name in secure.excluded else "no_update"}
                rnd.failed.append(name)
        rnd.waiting = set()
        rnd.rejected = sum(name in secure.excluded for name in rnd.selected)
        rnd.secure = {"protocol": self.cfg.secure.protocol, "bits": self.cfg.secure.bits, "degree": secure.choice.degree,
                      "threshold": secure.choice.threshold, "word_bits": secure.word_bits,
                      "phases": secure.phases, "server_s": t - (secure.phases[-1].get("t_end") or t),
                      "failed": secure.phase == "failed"}
        reaction = self._close(t)
        reaction.reports[0:0] = reports
        return reaction
