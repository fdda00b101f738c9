"""The hedging token bucket: exact milli-token arithmetic, its cap, and thread safety."""

from __future__ import annotations

import threading

from router.hedging import TokenBucket


def test_the_bucket_starts_empty_and_ten_refills_of_a_tenth_make_one_token() -> None:
    bucket = TokenBucket(50, 0.1)
    assert bucket.milli_tokens == 0 and not bucket.try_acquire()
    for _ in range(9):
        bucket.refill()
    assert bucket.milli_tokens == 900 and not bucket.try_acquire()
    bucket.refill()
    assert bucket.milli_tokens == 1000
    assert bucket.try_acquire() and bucket.milli_tokens == 0


def test_refills_stop_at_max_tokens() -> None:
    bucket = TokenBucket(2, 0.2)
    for _ in range(100):
        bucket.refill()
    assert bucket.tokens == 2.0
    tiny = TokenBucket(1, 0.001)
    for _ in range(999):
        tiny.refill()
    assert not tiny.try_acquire()
    tiny.refill()
    assert tiny.try_acquire()


def test_the_bucket_is_safe_across_threads() -> None:
    bucket = TokenBucket(250, 0.2)
    for _ in range(5 * 100):  # 100 tokens
        bucket.refill()
    taken: list[bool] = []
    lock = threading.Lock()

    def grab() -> None:
        mine = [bucket.try_acquire() for _ in range(50)]
        with lock:
            taken.extend(mine)

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(taken) == 100 and bucket.milli_tokens == 0
