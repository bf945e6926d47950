-- The shared budget's lease, run atomically in Redis by admitgate.backends.shared.RedisBudget.
-- KEYS: bucket, members, rates. ARGV: want, id, mine, fixed, burst, ttl, interval, backlog, new, overdraft.
-- Returns: grant, fleet rate, replicas, Redis time, Σbacklog, Σnew, this lease's serial number, and the serial number
-- of the live replicas' stalest last lease.
local bucket, members, rates = KEYS[1], KEYS[2], KEYS[3]
local want, id, mine = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local fixed, burst, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local interval = tonumber(ARGV[7]) or 0
local backlog, new = tonumber(ARGV[8]) or 0, tonumber(ARGV[9]) or 0
local overdraft = tonumber(ARGV[10]) or 0
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', members, now + ttl, id)
local dead = redis.call('ZRANGEBYSCORE', members, '-inf', now)
for _, d in ipairs(dead) do
  redis.call('ZREM', members, d)
  redis.call('HDEL', rates, d)
  redis.call('HDEL', bucket, 'mark:' .. d, 'seen:' .. d)
end
-- leases are numbered in the order Redis runs them: a replica can tell whether every other has leased since one
local serial = redis.call('HINCRBY', bucket, 'serial', 1)
redis.call('HSET', bucket, 'seen:' .. id, serial)
local stalest = serial
for _, m in ipairs(redis.call('ZRANGE', members, 0, -1)) do
  stalest = math.min(stalest, tonumber(redis.call('HGET', bucket, 'seen:' .. m)) or serial)
end
redis.call('HSET', rates, id, want .. ' ' .. backlog .. ' ' .. new .. ' ' .. mine)
local rate, wants, backlogs, news = 0, 0, 0, 0
for _, v in ipairs(redis.call('HVALS', rates)) do
  local w, b, n, h = string.match(v, '^([^ ]+) ([^ ]+) ([^ ]+) ([^ ]+)')
  rate = rate + (tonumber(h) or 0)
  wants = wants + (tonumber(w) or 0)
  backlogs = backlogs + (tonumber(b) or 0)
  news = news + (tonumber(n) or 0)
end
if fixed > 0 then rate = fixed end
local state = redis.call('HMGET', bucket, 'tokens', 'ts', 'spilt', 'used', 'mark:' .. id)
local tokens = tonumber(state[1]) or burst
local ts = tonumber(state[2]) or now
-- spilt: tokens refilled over the cap so far, which nobody was granted; used: how many of them paid overdrafts
local spilt, used = tonumber(state[3]) or 0, tonumber(state[4]) or 0
if now > ts then
  tokens = tokens + (now - ts) * rate
  if tokens > burst then spilt, tokens = spilt + tokens - burst, burst end
end
-- Tokens this replica refilled beyond its last grant because this lease came late are owed to the fleet.
-- Those the bucket spilt since this replica's last lease (and no other overdraft took) were nobody's: they
-- pay first. Taken from the bucket instead, they would be lost twice, and the others granted nothing for it.
local free = 0
if overdraft > 0 and state[5] then
  local s0, u0 = string.match(state[5], '^([^ ]+) ([^ ]+)')
  free = math.max(0, math.min(overdraft, (spilt - tonumber(s0)) - (used - tonumber(u0))))
end
used = used + free
tokens = tokens - (overdraft - free)
-- a fair share: when the replicas together want more than an interval's refill, each gets its part of it
local share = want
if interval > 0 and wants > rate * interval then share = rate * interval * want / wants end
-- The bucket may run into debt by one burst: leases come a little late or early, and a grant that
-- waited for the exact refill would lose the difference. The debt is paid before anything more is granted.
local grant = math.max(0, math.min(want, share, tokens + burst))
tokens = tokens - grant
redis.call('HSET', bucket, 'tokens', tostring(tokens), 'ts', tostring(now), 'spilt', tostring(spilt),
           'used', tostring(used), 'mark:' .. id, tostring(spilt) .. ' ' .. tostring(used))
local keep = math.ceil((ttl + 60) * 1000)
redis.call('PEXPIRE', bucket, keep)
redis.call('PEXPIRE', members, keep)
redis.call('PEXPIRE', rates, keep)
return {tostring(grant), tostring(rate), redis.call('ZCARD', members), tostring(now), tostring(backlogs),
        tostring(news), serial, stalest}
