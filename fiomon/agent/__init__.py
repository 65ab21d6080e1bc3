"""The agent: follows fio's output on a client host and publishes records over MQTT."""
