"""Gossip for membership and load (an optional transport, ``--gossip HOST:PORT,…``).

At a thousand experts, reading every rival's heartbeat from the store at every heartbeat is
a million rows a lease. With gossip, each expert learns its rivals and their load from a SWIM
cluster of the experts themselves (failure detection by kinship, the load map by
``contend.domain.loadmap``), and the store is left with what only it can do: claims, leases
and fences. An expert without gossip, or whose gossip has stopped, reads the store as before.
"""

from contend.gossip.node import TIMINGS, GossipNode, member_name
from contend.gossip.payload import BUDGET, record, summary

__all__ = ["BUDGET", "TIMINGS", "GossipNode", "member_name", "record", "summary"]
