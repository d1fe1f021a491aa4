-- name: extend
-- Pushes our lock's expiry out, only if it is still ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0

-- name: release
-- Compare-and-delete: never removes another holder's lock or a done marker.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
