"""`openstack gpu pool show`: the GPU pool's capacity and use."""

from osc_lib.command import command


class ShowPool(command.ShowOne):
    """Show the GPU pool: its totals (admins: and how many hosts it has)."""

    def take_action(self, args):
        client = self.app.client_manager.gpu
        pool = client.get("/v1/pool")
        totals = pool.get("totals") or {}
        columns = ["gpus", "idle_gpus", "cgpus", "memory_mib", "allocated_mib"]
        values = [totals.get(c) for c in columns]
        if isinstance(pool.get("hosts"), list):
            hosts = list(pool["hosts"])
            path = pool.get("next")
            while path:
                page = client.get(path)
                hosts.extend(page.get("hosts") or [])
                path = page.get("next")
            columns.append("hosts")
            values.append(", ".join(h.get("name", "") for h in hosts))
        return tuple(columns), tuple(values)
