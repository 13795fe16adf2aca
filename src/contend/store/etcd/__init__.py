"""The etcd v3 store: many hosts share one etcd cluster; a claim is one etcd transaction."""

from contend.store.etcd.store import (
    DELETE,
    GET,
    LEVEL_SWEEP,
    PUT,
    EtcdStore,
    _put,
    _Rec,
    etcd_url_options,
    parse_etcd_url,
)

__all__ = [
    "DELETE",
    "GET",
    "LEVEL_SWEEP",
    "PUT",
    "EtcdStore",
    "_Rec",
    "_put",
    "etcd_url_options",
    "parse_etcd_url",
]
