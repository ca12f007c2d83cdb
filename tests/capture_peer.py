"""A minimal Kafka peer built only from Strata's protocol layer, for protocol-level tests.

It answers ApiVersions, Metadata and Produce well enough for a real client to produce to one
topic, and keeps every Produce request's record bytes. It exists so the codec tests can check
what real clients (librdkafka, kafka-python, aiokafka) put on the wire before the broker exists;
it stores nothing and serves no fetches.
"""

from __future__ import annotations

import asyncio
import threading

from protocol.framing import FrameReader, frame
from protocol.generated.api_versions import ApiVersionsResponse
from protocol.generated.metadata import MetadataResponse
from protocol.generated.produce import ProduceResponse
from protocol.headers import UnsupportedRequest, decode_request, encode_response

# Fetch and FindCoordinator are listed (never served) because librdkafka decides its features
# from them: magic-2 batches need Produce >= 3 and Fetch >= 4, lz4 needs FindCoordinator.
SERVED = {18: (0, 4), 3: (0, 12), 0: (3, 11), 1: (4, 12), 10: (0, 4)}


class CapturePeer:
    def __init__(self, topic: str, partitions: int = 1) -> None:
        self.topic = topic
        self.partitions = partitions
        self.captured: list[tuple[int, int, bytes]] = []  # (partition, produce version, records)
        self.errors: list[str] = []
        self._offsets = [0] * partitions
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    def __enter__(self) -> CapturePeer:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self._loop)
        for t in tasks:
            t.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader()
        try:
            while data := await reader.read(65536):
                for f in frames.feed(data):
                    writer.writelines(frame(self._answer(f)))
                await writer.drain()
        except asyncio.CancelledError:
            pass
        except Exception as e:  # recorded: the test asserts there were none
            self.errors.append(repr(e))
        finally:
            writer.close()

    def _answer(self, f: bytes) -> list:
        try:
            req = decode_request(f)
        except UnsupportedRequest as e:
            if e.api_key == 18:  # Kafka's fallback: v0 body listing what we serve
                return encode_response(18, 0, e.correlation_id, self._api_versions(35))
            raise
        key, v, cid = req.api_key, req.api_version, req.correlation_id
        if key == 18:
            body = self._api_versions(0)
        elif key == 3:
            P = MetadataResponse.MetadataResponsePartition
            body = MetadataResponse(
                brokers=[MetadataResponse.MetadataResponseBroker(node_id=1, host="127.0.0.1", port=self.port)],
                cluster_id="capture",
                controller_id=1,
                topics=[
                    MetadataResponse.MetadataResponseTopic(
                        name=self.topic,
                        partitions=[
                            P(partition_index=i, leader_id=1, leader_epoch=0, replica_nodes=[1], isr_nodes=[1])
                            for i in range(self.partitions)
                        ],
                    )
                ],
            )
        elif key == 0:
            out = []
            for t in req.body.topic_data:
                parts = []
                for p in t.partition_data:
                    self.captured.append((p.index, v, bytes(p.records)))
                    parts.append(
                        ProduceResponse.PartitionProduceResponse(index=p.index, base_offset=self._offsets[p.index])
                    )
                    self._offsets[p.index] += 1_000_000  # any increasing offsets will do
                out.append(ProduceResponse.TopicProduceResponse(name=t.name, partition_responses=parts))
            if req.body.acks == 0:
                return []
            body = ProduceResponse(responses=out)
        else:
            raise AssertionError(f"capture peer got unexpected API {key}")
        return encode_response(key, v, cid, body)

    def _api_versions(self, error: int) -> ApiVersionsResponse:
        A = ApiVersionsResponse.ApiVersion
        return ApiVersionsResponse(
            error_code=error, api_keys=[A(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in SERVED.items()]
        )
