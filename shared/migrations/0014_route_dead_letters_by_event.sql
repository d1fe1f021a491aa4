-- A routed event's page (its archived arrivals: the console, `events show`,
-- GET /admin/events/KEY) lists its routes' dead letters too: each is keyed
-- KEY#ROUTE, found here by the event's own key KEY (docs/design.md, "Routes").
CREATE INDEX dead_letters_route_event_key ON dead_letters (left(key, -(length(route) + 1)))
    WHERE route IS NOT NULL;
