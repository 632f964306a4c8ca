"""The clusters of ``metricsd federate``: flags and file parsed and checked, errors naming the flag."""

from __future__ import annotations

import pytest

from metricsd.cmd.main import build_parser
from metricsd.federation.spec import ClusterTarget, SpecError, load_clusters_file, parse_cluster_flag, parse_clusters


def test_a_flag_is_a_name_and_an_address() -> None:
    assert parse_cluster_flag("eu-1=127.0.0.1:7401") == ClusterTarget("eu-1", "127.0.0.1:7401")


@pytest.mark.parametrize(("text", "message"), [
    ("foo", "--cluster 'foo': expected NAME=HOST:PORT"),
    ("=127.0.0.1:1", "cluster name ''"),
    ("a b=127.0.0.1:1", "cluster name 'a b'"),
    ("a=127.0.0.1", "address '127.0.0.1' is not HOST:PORT"),
    ("a=127.0.0.1:0", "is not HOST:PORT"),
    ("a=127.0.0.1:70000", "is not HOST:PORT"),
])
def test_a_bad_flag_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=r"^--cluster") as e:
        parse_cluster_flag(text)
    assert message in str(e.value)


def test_names_are_unique_and_at_least_one_is_given() -> None:
    a = ClusterTarget("a", "h:1")
    with pytest.raises(SpecError, match="cluster name 'a' given twice"):
        parse_clusters([a, ClusterTarget("a", "h:2")])
    with pytest.raises(SpecError, match="no clusters given"):
        parse_clusters([])


def test_a_file_lists_clusters_as_a_mapping_or_a_list() -> None:
    assert load_clusters_file("clusters:\n  a: h:1\n  b: h:2\n", "f") == [ClusterTarget("a", "h:1"),
                                                                           ClusterTarget("b", "h:2")]
    assert load_clusters_file("clusters:\n- {name: a, address: 'h:1'}\n", "f") == [ClusterTarget("a", "h:1")]
    for text, message in (("clusters: [", "not valid YAML"), ("[]", "a 'clusters' key"),
                          ("clusters:\n- {name: a}\n", "exactly 'name' and 'address'"),
                          ("clusters:\n- {name: a, address: 'h:1'}\n- {name: a, address: 'h:2'}\n", "given twice"),
                          ("clusters: 3", "mapping of name to address")):
        with pytest.raises(SpecError, match=r"^f: ") as e:
            load_clusters_file(text, "f")
        assert message in str(e.value)


@pytest.mark.parametrize(("argv", "message"), [
    (["--cluster", "foo"], "--cluster 'foo': expected NAME=HOST:PORT"),
    (["--cluster", "a=127.0.0.1:1", "--cluster", "a=127.0.0.1:2"], "cluster name 'a' given twice"),
    ([], "no clusters given"),
    (["--cluster", "a=127.0.0.1:1", "--cluster-timeout", "0"], "--cluster-timeout must be positive"),
    (["--clusters-file", "/nonexistent/clusters.yaml"], "--clusters-file /nonexistent/clusters.yaml"),
])
def test_the_command_exits_2_naming_the_bad_flag_before_listening(argv: list[str], message: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser(["federate"])
    args = parser.parse_args(["federate", *argv, "--grpc-port", "0", "--http-port", "-1"])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("metricsd federate: ") and message in err
