"""webhook_ingest.workers.failures: what each of its modules holds.

- outage           Outages are not failures (docs/reference.md §7): telling them apart, and waiting them out.
- incident_counts  Retries counted in their incidents behind the runs' backs.
- notifications    Notifications of incidents (docs/oncall.md, "Incidents")
"""
