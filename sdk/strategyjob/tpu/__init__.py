"""``strategyjob.tpu``: mirrors ``tf.tpu`` (``tf.tpu.experimental.Topology`` and
``DeviceAssignment``). Torch-free: the topology arithmetic needs only numpy."""
