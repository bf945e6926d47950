-- A per-key quota (GCRA), run atomically in Redis by admitgate.backends.quota.RedisQuota.
-- KEYS: the key's theoretical arrival time (TAT). ARGV: interval T, tolerance tau (seconds).
-- Returns "<wait> <backlog>" in seconds: wait 0 if the request is allowed (and counted), and then how far
-- the key's TAT runs ahead of now.
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local wait = tat - tolerance - now
if wait > 1e-6 then return string.format('%.6f 0', wait) end
tat = tat + interval
redis.call('SET', KEYS[1], string.format('%.6f', tat))
redis.call('PEXPIRE', KEYS[1], math.ceil((tat - now) * 1000) + 1)
return string.format('0 %.6f', tat - now)
