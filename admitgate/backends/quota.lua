-- Per-key quotas (GCRA), several windows at once, run atomically in Redis by admitgate.backends.quota.RedisQuota.
-- KEYS[i]: one window's theoretical arrival time (TAT) for one key. ARGV[2i-1], ARGV[2i]: that window's
-- interval T and tolerance tau (seconds). A request is allowed only if every window allows it, and is then
-- counted in each; a refused one is counted in none.
-- Returns "<wait> <i>" if refused (the longest wait in seconds, and the 1-based index of its window), else
-- "0 <backlog 1> ... <backlog n>": how far each window's TAT runs ahead of now, in seconds.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tats = {}
local worst, refused = 1e-6, 0
for i = 1, #KEYS do
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then tat = now end
  tats[i] = tat
  local wait = tat - tonumber(ARGV[2 * i]) - now
  if wait > worst then worst, refused = wait, i end
end
if refused > 0 then return string.format('%.6f %d', worst, refused) end
local out = {'0'}
for i = 1, #KEYS do
  local tat = tats[i] + tonumber(ARGV[2 * i - 1])
  redis.call('SET', KEYS[i], string.format('%.6f', tat), 'PX', math.ceil((tat - now) * 1000) + 1)
  out[i + 1] = string.format('%.6f', tat - now)
end
return table.concat(out, ' ')
