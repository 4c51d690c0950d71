"""Publishes KV events over real ZeroMQ (pyzmq, libzmq) the way vLLM's
ZmqEventPublisher does (vllm/distributed/kv_events.py): PUB frames
[topic, seq as 8 big-endian bytes, msgpack batch], a ROUTER answering
[identity, "", start seq] with [identity, "", seq, batch] per buffered batch
and [identity, "", -1, ""] at the end.

Usage: vllm_publisher.py map|array. Publishes one batch storing three blocks
of four tokens (token ids 100..111), prints "PUB_PORT REPLAY_PORT", then,
every 5 ms, publishes a batch removing a block nobody stored, until stdin closes.
"map" encodes as current vLLM (msgspec structs as maps, tag under "type",
sha256 block hashes as bytes); "array" as vLLM releases whose structs were
array_like (integer hashes, the oldest field order).
"""
import hashlib
import select
import sys
import time

import msgpack
import zmq

mode = sys.argv[1]
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
router = ctx.socket(zmq.ROUTER)
replay_port = router.bind_to_random_port("tcp://127.0.0.1")
tokens = list(range(100, 112))


def stored():
    if mode == "map":
        hashes = [hashlib.sha256(bytes([i])).digest() for i in range(3)]
        ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
              "token_ids": tokens, "block_size": 4, "lora_id": None, "medium": "GPU",
              "lora_name": None}
        return {"ts": time.time(), "events": [ev], "data_parallel_rank": 0}
    ev = ["BlockStored", [-3, 7, 2**63 + 5], None, tokens, 4, None, "GPU"]
    return [time.time(), [ev], 0]


def removed():
    if mode == "map":
        ev = {"type": "BlockRemoved", "block_hashes": [b"\x00" * 32], "medium": "GPU"}
        return {"ts": time.time(), "events": [ev], "data_parallel_rank": 0}
    return [time.time(), [["BlockRemoved", [12345], "GPU"]], 0]


buffer = []
seq = 0


def publish(batch):
    global seq
    payload = msgpack.packb(batch, use_bin_type=True)
    pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
    buffer.append((seq, payload))
    seq += 1


# Published before anyone knows the ports: a subscriber can only have it
# through a replay.
publish(stored())
print(pub_port, replay_port, flush=True)
while True:
    if select.select([sys.stdin], [], [], 0)[0] and not sys.stdin.readline():
        break
    while router.poll(0):
        ident, _, start = router.recv_multipart()
        first = int.from_bytes(start, "big")
        for s, payload in buffer:
            if s >= first:
                router.send_multipart([ident, b"", s.to_bytes(8, "big"), payload])
        router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])
    publish(removed())
    time.sleep(0.005)
