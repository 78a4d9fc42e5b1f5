"""Ceilometer's meters of gsaasd's notifications, from a real RabbitMQ: the meter definitions of
deploy/ceilometer as shipped, loaded and applied by Ceilometer's own notification endpoint
(ceilometer.meter.notifications.ProcessMeterNotifications, the meter pipeline's), fed by an
oslo.messaging batch notification listener set up as ceilometer-agent-notification sets up its
own (ceilometer.notification: topic `notifications` on each control exchange, requeue allowed).
Prints `listening` once consuming, then one JSON line per sample Ceilometer built.

    python ceilometer_meters.py METERS_DIR TRANSPORT_URL EXCHANGE

Run with the venv of `scripts/openstack-clients.sh ceilometer` (tests/openstack_clients.rs),
which kills it when done; it also stops when its standard input closes.
"""
import json
import os
import sys
import tempfile
import threading

import oslo_messaging
from ceilometer import messaging
from ceilometer import service
from ceilometer.meter import notifications

_lock = threading.Lock()


class Printer:
    """A publisher as the pipeline gives its endpoints: `with publisher as p: p(samples)`."""

    def __enter__(self):
        return self.publish

    def __exit__(self, *exc):
        return False

    def publish(self, samples):
        with _lock:
            for s in samples:
                print(json.dumps({
                    "name": s.name,
                    "type": s.type,
                    "unit": s.unit,
                    "volume": s.volume,
                    "user_id": s.user_id,
                    "project_id": s.project_id,
                    "resource_id": s.resource_id,
                    "timestamp": s.timestamp,
                    "metadata": s.resource_metadata,
                }, default=str), flush=True)


def main(meters_dir, url, exchange):
    # The settings a deployment's ceilometer.conf would carry for gsaasd (deploy/ceilometer's
    # header): its meter definitions, its exchange, and durable queues, as gsaasd declares its
    # exchange and queues by default ([notifications] durable).
    conf_file = tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False)
    conf_file.write(
        "[DEFAULT]\nuse_stderr = true\n"
        f"[meter]\nmeter_definitions_dirs = {meters_dir}\n"
        f"[notification]\nnotification_control_exchanges = {exchange}\n"
        "[oslo_messaging_rabbit]\namqp_durable_queues = true\n")
    conf_file.close()
    conf = service.prepare_service(argv=["ceilometer-meters"], config_files=[conf_file.name])
    os.unlink(conf_file.name)
    endpoint = notifications.ProcessMeterNotifications(conf, Printer())
    names = sorted(d.cfg["name"] for d in endpoint.definitions)
    if not names:
        sys.exit(f"no meter definitions loaded from {meters_dir}")
    print(json.dumps({"definitions": names}), flush=True)
    transport = messaging.get_transport(conf, url)
    targets = [oslo_messaging.Target(topic="notifications", exchange=e)
               for e in conf.notification.notification_control_exchanges]
    listener = messaging.get_batch_notification_listener(
        transport, targets, [endpoint], allow_requeue=True, batch_size=1)
    listener.start()
    print("listening", flush=True)
    sys.stdin.read()
    listener.stop()
    listener.wait()


if __name__ == "__main__":
    main(*sys.argv[1:4])
