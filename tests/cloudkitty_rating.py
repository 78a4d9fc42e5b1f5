"""What CloudKitty's Prometheus collector rates of a project from deploy/cloudkitty/metrics.yml:
the configuration checked by CloudKitty's own schema, each metric's PromQL built by CloudKitty's
own query builder, asked of Prometheus with CloudKitty's client, converted with CloudKitty's unit
conversion (as PrometheusCollector.fetch_all does). Prints one JSON line per rated group.

    python cloudkitty_rating.py METRICS_YML PROMETHEUS_URL PROJECT START END   (unix seconds)

Run with the venv of `scripts/openstack-clients.sh cloudkitty` (tests/openstack_clients.rs).
"""
import datetime
import decimal
import json
import sys

import yaml
from cloudkitty import utils as ck_utils
from cloudkitty.collector import prometheus
from cloudkitty.common.prometheus_client import PrometheusClient


def main(metrics_yml, url, project, start, end):
    conf = prometheus.PrometheusCollector.check_configuration(yaml.safe_load(open(metrics_yml)))
    utc = datetime.timezone.utc
    start = datetime.datetime.fromtimestamp(int(start), utc)
    end = datetime.datetime.fromtimestamp(int(end), utc)
    client = PrometheusClient(url)
    for name, metric in conf.items():
        groupby = [g for g in metric["groupby"] if g != "project_id"]
        query = prometheus.PrometheusCollector.build_query(
            conf, name, start, end, "project_id", project, groupby, metric["metadata"])
        answer = client.get_instant(query, end.isoformat())
        for item in answer["data"]["result"]:
            qty = ck_utils.convert_unit(
                +decimal.Decimal(item["value"][1]), metric["factor"], metric["offset"])
            print(json.dumps({
                "metric": metric.get("alt_name", name),
                "unit": metric["unit"],
                "query": query,
                "groups": {g: item["metric"].get(g, "") for g in groupby},
                "qty": float(qty),
            }))


if __name__ == "__main__":
    main(*sys.argv[1:6])
