"""The training loop: config in, a trained model and its `Result` out.

Importable from a notebook: `train_and_evaluate(get_config(), workdir)`.
"""

from __future__ import annotations

import time

import ml_collections
import tensorflow as tf

from xla_mnist import data, devices, model, outputs, step


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, data_dir: str
) -> outputs.Result:
  """Trains `config`'s recipe, evaluates on the test split, writes outputs."""
  step.configure_jit(config.jit)  # Before anything compiles a function.
  outputs.prepare_workdir(workdir)
  device = devices.select(config.device)
  dataset = data.load(config.dataset, config.idx_dir, data_dir)
  print(('prepared ' if dataset.prepared_now else 'using ') + dataset.source)

  with tf.device(device):
    net = model.create_model()
    optimizer = tf.keras.optimizers.SGD(config.learning_rate)
    optimizer.build(net.trainable_variables)
    train_step = step.make_train_step(
      net, optimizer, config.jit, config.batch_size
    )
    batches = iter(
      data.train_batches(dataset.train, config.batch_size, config.seed)
    )
    writer = tf.summary.create_file_writer(workdir)
    with writer.as_default(step=0):
      images, labels = next(batches)
      # Trace once, explicitly, to hand the step's graph to TensorBoard.
      tf.summary.graph(train_step.get_concrete_function(images, labels).graph)
      start = time.perf_counter()
      loss = float(train_step(images, labels))
      compile_seconds = time.perf_counter() - start

      start = window_start = time.perf_counter()
      window_first = 2
      for i in range(2, config.num_steps + 1):
        loss = train_step(*next(batches))
        if i % config.log_every == 0 or i == config.num_steps:
          loss = float(loss)  # Waits for the step: the window ends here.
          now = time.perf_counter()
          rate = (i - window_first + 1) / (now - window_start)
          print(
            f'step {i:>6}/{config.num_steps}'
            f'  loss {loss:.4f}  {rate:,.0f} steps/s'
          )
          tf.summary.scalar('loss', loss, step=i)
          tf.summary.scalar('steps_per_second', rate, step=i)
          window_start, window_first = now, i + 1
      train_seconds = time.perf_counter() - start

      evaluate = step.make_eval_step(net, config.jit)
      accuracy = float(evaluate(dataset.test.images, dataset.test.labels))
      tf.summary.scalar('test_accuracy', accuracy, step=config.num_steps)
    writer.close()

  result = outputs.Result(
    dataset=config.dataset,
    jit=config.jit,
    device=device.removeprefix('/device:'),
    steps=config.num_steps,
    batch_size=config.batch_size,
    final_loss=float(loss),
    test_accuracy=accuracy,
    compile_seconds=compile_seconds,
    train_seconds=train_seconds,
    steps_per_second=(config.num_steps - 1) / max(train_seconds, 1e-9),
    traces=train_step.experimental_get_tracing_count(),
    workdir=workdir,
  )
  outputs.write_result(result)
  return result
