"""How a run's actors are wired, one class per topology (after Mininet's Topo): which actors
exist besides the clients and where they run, their links, who starts the clock and who hears
of lost hosts, what the client hosts run, how round rows are assembled, and what summary.json
says of it, and what it works with (`fits`, which the scenario schema asks: emulator/rules.py).
The conductor, the CLI and the schema ask the topology and never branch on its name; the world
builder (emulator/world.py) builds each topology's own parts (the ring's order, the edges)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar

from node.processes import flower_server_main, server_main, warmup_main
from .netconfig import SERVER, Link
from .results import RingRounds
from .rules import Fits

if TYPE_CHECKING:  # the world builder imports the schema, which asks the topologies
    from .world import World

DOWNLOAD_CARRIES_WEIGHTS = {"algorithm.codec.down": "the download carries the model's weights"}


def _notify_closed_refused(sc) -> str:
    return (f"the synchronous server of topology star tells clients that a round closed; here the topology is "
            f"{sc.topology} and algorithm.name {sc.algorithm.name}")

SavedFiles = Callable[[list[str]], "list[str] | None"]  # actors -> the checkpoint files that hold them


class Topology:
    name: ClassVar[str] = ""
    peer_traffic: ClassVar[bool] = False  # rounds move bytes between clients (what the progress line shows)
    evaluates_on_clients: ClassVar[bool] = False  # each client scores the model on its own test split
    runs_strategy: ClassVar[bool] = True  # a server strategy of ours runs (not the ring's own algorithm)

    def __init__(self, world: World):
        self.world = world

    @classmethod
    def fits(cls, sc) -> Fits:
        """What a scenario on this topology may use (emulator/rules.py)."""
        raise NotImplementedError

    @classmethod
    def world_parts(cls, sc, clients: list, task, server, group_of: dict) -> dict[str, Any]:
        """What the world holds for this topology beyond clients and links (World fields; "server"
        replaces the server's configuration)."""
        return {}

    @property
    def client_names(self) -> list[str]:
        return [c.profile.name for c in self.world.clients]

    def server_actors(self) -> list[str]:
        """The non-client actors, all in the server process."""
        return [SERVER]

    def links(self) -> dict[str, Link]:
        return {**{c.profile.name: c.link for c in self.world.clients}, SERVER: self.world.server_link}

    def starters(self) -> list[str]:
        """Who gets `start` at t = 0."""
        return [SERVER]

    def watchers(self) -> list[str]:
        """Who learns that a host is lost."""
        return self.server_actors()

    def barrier_group(self) -> list[str]:
        """Who meets at barriers for checkpoints (emulator/barriers.py): actors that run on their own."""
        return []

    def server_process(self, endpoint: str, parent_pid: int, saved: SavedFiles) -> tuple | None:
        """(name, role, target, args) of the server process, or None."""
        w = self.world
        return ("server", "server", server_main, (endpoint, w.server, self.client_names, w.task, 1, parent_pid, saved([SERVER])))

    def host_config(self):
        """What every client host runs its clients with."""
        return self.world.client

    def client_rounds(self) -> RingRounds | None:
        """An assembler of round rows from the clients' own reports, where no server sees a round end."""
        return None

    def writer_options(self) -> dict[str, Any]:
        return {}

    def summary(self) -> dict[str, Any]:
        return {"clients_per_round": self.world.server.clients_per_round}


class Star(Topology):
    name = "star"

    @classmethod
    def fits(cls, sc) -> Fits:
        return Fits(who="topology star", weights_on=DOWNLOAD_CARRIES_WEIGHTS,
                    hierarchy="applies to topology hierarchical, not star")

    def server_process(self, endpoint, parent_pid, saved):
        if self.world.flower is None:
            return super().server_process(endpoint, parent_pid, saved)
        return ("server", "server", flower_server_main, (endpoint, self.world.flower[0], self.client_names, 1, parent_pid))

    def host_config(self):
        return self.world.client if self.world.flower is None else self.world.flower[1]


class Ring(Topology):
    """Gossip between ring neighbours: every client starts itself and watches its peers. The only
    server is FibFL++'s warm-up aggregator, where it is an actor of its own (with the server's link)."""
    name = "ring"
    peer_traffic = True
    evaluates_on_clients = True
    runs_strategy = False

    @classmethod
    def world_parts(cls, sc, clients, task, server, group_of):
        from .world import ring_config  # noqa: PLC0415  (the world builder imports this module)

        return {"ring": ring_config(sc, clients, task)}

    @classmethod
    def fits(cls, sc) -> Fits:
        star_only = "applies to star algorithms only"
        return Fits(
            who="topology ring", algorithms=("fibfl",), min_clients=3,
            selection="a ring has no server to select; every client takes part in every round",
            offline_without_pass_timeout="a ring waits for its neighbours; with devices that go offline set "
                                         "algorithm.firma.pass_timeout_s",
            privacy=("none",), privacy_why=f"algorithm.privacy {star_only}", adaptive_bits=star_only,
            codec_time="charged to the clients of a server; a ring's gossip is not",
            notify_closed=_notify_closed_refused(sc),
            upload_error_feedback="kept by the clients of a star on their uploads; ring gossip carries each client's weights",
            layered_uploads="per-layer codecs apply to star algorithms",
            weights_on={**DOWNLOAD_CARRIES_WEIGHTS, "algorithm.codec.up": "ring gossip carries each client's weights"},
            hierarchy="applies to topology hierarchical, not ring")

    def server_actors(self) -> list[str]:
        r = self.world.ring
        return [r.aggregator] if r.warmup and r.aggregator not in r.order else []

    def links(self) -> dict[str, Link]:
        own = {name: self.world.server_link for name in self.server_actors()}
        return {**{c.profile.name: c.link for c in self.world.clients}, **own}

    def starters(self) -> list[str]:
        return self.client_names

    def barrier_group(self) -> list[str]:
        return self.client_names

    def watchers(self) -> list[str]:
        return [*self.client_names, *self.server_actors()]

    def server_process(self, endpoint, parent_pid, saved):
        if not self.server_actors():
            return None
        w = self.world
        return ("server", "server", warmup_main, (endpoint, w.ring, w.task, w.server.aggregate_s, 1, parent_pid,
                                                  saved(self.server_actors())))

    def host_config(self):
        return self.world.ring

    def client_rounds(self) -> RingRounds:
        return RingRounds(self.client_names)

    def summary(self) -> dict[str, Any]:
        r = self.world.ring
        return {"ring": {"variant": r.variant, "order": r.order, "passes": r.passes, "warmup_rounds": r.warmup,
                         "warmup_aggregator": r.aggregator if r.warmup else None}}


class Hierarchical(Topology):
    """A cloud server whose clients are edge aggregators, each with its own link and clients."""
    name = "hierarchical"

    @classmethod
    def world_parts(cls, sc, clients, task, server, group_of):
        from .world import cloud_config, hierarchy_edges  # noqa: PLC0415  (the world builder imports this module)

        edges = hierarchy_edges(sc, clients, server, group_of)
        return {"edges": edges, "server": cloud_config(sc, server, edges)}

    @classmethod
    def fits(cls, sc) -> Fits:
        return Fits(who="topology hierarchical", adaptive_bits="adaptive bit schedules follow a star's rounds; use static",
                    notify_closed=_notify_closed_refused(sc),
                    weights_on={**DOWNLOAD_CARRIES_WEIGHTS,
                                "hierarchy.codec": "edges and the cloud exchange the models' weights both ways"})

    def server_actors(self) -> list[str]:
        return [SERVER, *(e.name for e in self.world.edges)]

    def links(self) -> dict[str, Link]:
        return {**super().links(), **{e.name: e.link for e in self.world.edges}}

    def server_process(self, endpoint, parent_pid, saved):
        w = self.world
        return ("server", "server", server_main, (endpoint, w.server, [e.name for e in w.edges], w.task, 1, parent_pid,
                                                  saved([SERVER]), w.edges))

    def writer_options(self) -> dict[str, Any]:
        return {"aggregators": [e.name for e in self.world.edges]}

    def summary(self) -> dict[str, Any]:
        return {"clients_per_round": sum(e.server.clients_per_round for e in self.world.edges),
                "edges": {e.name: {"clients": len(e.clients), "per_round": e.server.clients_per_round}
                          for e in self.world.edges}, "edge_rounds": self.world.edges[0].edge_rounds}


TOPOLOGIES: dict[str, type[Topology]] = {cls.name: cls for cls in (Star, Ring, Hierarchical)}


def topology_of(name: str, world: World) -> Topology:
    return TOPOLOGIES[name](world)
