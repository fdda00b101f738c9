-- KEYS: seq. Returns {head n, epoch} (0, 0 when the log has none).
return {tonumber(redis.call('HGET', KEYS[1], 'n') or '0'), redis.call('HGET', KEYS[1], 'e') or '0'}
