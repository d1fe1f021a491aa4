-- Routes (docs/reference.md §3 `routes`): a dead letter of one route's run
-- names its route, so on-call sees it and a replay runs only that route
-- (its key is then KEY#ROUTE). NULL: the source's one handler, as before.
ALTER TABLE dead_letters ADD COLUMN route text;
