"""Client quotas (Kafka's producer_byte_rate, consumer_byte_rate, request_percentage): which quota
applies to a request (resolve.py), how fast a client goes (rate.py), how long it must wait
(manager.py), and how much of the event loop a request took (step_timer.py)."""
