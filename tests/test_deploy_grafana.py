"""deploy/grafana/*.json: Grafana's dashboard model, every target's PromQL parsed by the project's
parser (after Grafana's substitutions) and every variable a `label_values()` over metricsd's API.
tests/test_deploy_grafana_live.py runs the same queries against a populated metricsd."""

from __future__ import annotations

from typing import Any

import pytest
from grafana_dashboards import label_values, load, panels, query_variables, substitute, variable_query

from metricsd.http.params import parse_series_selector
from metricsd.promql.engine import parse
from metricsd.promql.limits import QueryLimits, prescan

BOARDS = load()
DS_REF = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"timeseries", "stat", "table", "bargauge"}


def test_the_four_dashboards_of_the_issue_are_there() -> None:
    titles = sorted(b["title"] for b in BOARDS.values())
    assert titles == ["metricsd / Cluster overview", "metricsd / Lendable capacity by hour",
                      "metricsd / VPA recommendations against requests",
                      "metricsd / Workload: CPU, memory and the HPA"]
    assert len({b["uid"] for b in BOARDS.values()}) == len(BOARDS)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_model_is_grafanas(name: str) -> None:
    board = BOARDS[name]
    assert 36 <= board["schemaVersion"] <= 41
    assert isinstance(board["uid"], str) and 0 < len(board["uid"]) <= 40
    variables = board["templating"]["list"]
    assert variables[0] == {**variables[0], "name": "datasource", "type": "datasource", "query": "prometheus"}
    names = [v["name"] for v in variables]
    assert len(set(names)) == len(names)
    ids = [p["id"] for p in panels(board)]
    assert len(set(ids)) == len(ids) and all(isinstance(i, int) for i in ids)
    for panel in panels(board):
        where = f"{name} panel {panel['id']} {panel.get('title')!r}"
        assert panel["type"] in PANEL_TYPES, where
        assert panel["datasource"] == DS_REF, where
        grid = panel["gridPos"]
        assert set(grid) >= {"h", "w", "x", "y"} and grid["w"] >= 1 and grid["h"] >= 1, where
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, where
        assert panel["targets"], where
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs) and all(refs), where
        for target in panel["targets"]:
            assert target["datasource"] == DS_REF, where
            assert isinstance(target["expr"], str) and target["expr"].strip(), where
            # every $variable a query uses is defined on the dashboard (or is a Grafana macro)
            used = {w.strip("{}") for w in _dollars(target["expr"])}
            assert used <= set(names) | {"__rate_interval", "__interval", "__range"}, (where, used)


def test_panels_do_not_overlap() -> None:
    for name, board in BOARDS.items():
        cells: dict[tuple[int, int], int] = {}
        for panel in panels(board):
            g = panel["gridPos"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{name}: panels {cells.get((x, y))} and {panel['id']} overlap"
                    cells[(x, y)] = panel["id"]


def _dollars(expr: str) -> list[str]:
    import re

    return re.findall(r"\$(\{?[a-zA-Z_][a-zA-Z0-9_]*\}?)", expr)


def _sample_values(board: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: "x" for v in board["templating"]["list"]}


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_expr_parses_with_the_projects_parser_within_the_query_limits(name: str) -> None:
    board = BOARDS[name]
    for panel in panels(board):
        for target in panel["targets"]:
            text = substitute(target["expr"], _sample_values(board))
            assert "$" not in text, text
            prescan(text, QueryLimits())  # raises when metricsd would refuse it before parsing
            parse(text)  # raises PromQLError(bad_data) for what the parser refuses


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_variables_are_label_values_queries_metricsd_answers(name: str) -> None:
    board = BOARDS[name]
    defined: set[str] = {"datasource"}
    for var in query_variables(board):
        assert var["datasource"] == DS_REF
        selector, label = label_values(variable_query(var))
        assert var.get("definition", variable_query(var)) == variable_query(var)
        if selector is not None:
            assert {w.strip("{}") for w in _dollars(selector)} <= defined, "a variable refers to a later one"
            parse_series_selector(substitute(selector, _sample_values(board)))  # as /api/v1/label/... parses match[]
        defined.add(var["name"])
        assert label
