"""Links (grid/link.py) on a real cluster: a client reaches every member it knows from the
member list by its link, large messages cross them in both directions, and links run on Unix
sockets by default and on TCP when the configuration says so."""

from __future__ import annotations

import os
import socket

import pytest

from grid.link import ABSTRACT_UNIX

pytestmark = pytest.mark.timeout(120)


def test_a_client_talks_to_every_member_over_its_link(grid_cluster, request):
    with grid_cluster.connect() as client:
        m = client.get_map(request.node.name)
        entries = {f"k{i}": i for i in range(300)}
        m.put_all(entries)
        assert m.get_all(list(entries)) == entries
        members = client._invoker.members.members
        assert len(members) == 3 and all(info.link for info in members)
        assert set(client._invoker.links) == {info.endpoint for info in members}
        if ABSTRACT_UNIX:
            assert all(info.link.startswith("unix:@") for info in members)
            assert {link.sock.family for link in client._invoker.links.values()} == \
                {socket.AF_UNIX}


def test_values_larger_than_a_socket_buffer_cross_links_both_ways(grid_cluster, request):
    with grid_cluster.connect() as client:
        m = client.get_map(request.node.name)
        values = {f"big{i}": os.urandom(1024) * (6 * 1024 + i) for i in range(3)}  # ~6 MiB
        m.put_all(values)  # client -> owner, and owner -> backup
        for key, value in values.items():
            assert m.get(key) == value  # owner -> client
        assert m.get_all(list(values)) == values


def test_links_run_on_tcp_when_configured(cluster_factory, tmp_path, request):
    config = tmp_path / "shmgrid.toml"
    config.write_text('link_transport = "tcp"\n')
    cluster = cluster_factory(members=3, config=str(config))
    with cluster.connect() as client:
        m = client.get_map(request.node.name)
        entries = {f"k{i}": i for i in range(300)}
        m.put_all(entries)
        for i in range(50):
            assert m.put(f"k{i}", -i) == i  # owner -> backup -> client, over TCP
        assert m.get_all(list(entries)) == {**entries, **{f"k{i}": -i for i in range(50)}}
        members = client._invoker.members.members
        assert all(info.link.startswith("127.0.0.1:") for info in members)
        assert {link.sock.family for link in client._invoker.links.values()} == \
            {socket.AF_INET}
