"""The TF1 program's recipe on MNIST: softmax regression, SGD 0.5, 1000x100."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # Any TFDS image dataset by name (docs/data.md): cifar10, emnist/letters...
  config.dataset = 'mnist'
  # mnist or fashion_mnist: folder of the four IDX files; '' = Debian's/TFDS's.
  config.idx_dir = ''
  config.image_dir = ''  # A folder of images: <split>/<class>/<image>.
  config.train_split = 'train'  # TFDS's split names or slices, or folders.
  config.test_split = 'test'
  config.image_size = 0  # > 0: resize every image to that square.
  # A TFDS dataset's ClassLabel feature; '' = its supervised label (cifar100:
  # 'coarse_label' for its 20 superclasses).
  config.label = ''
  # 'resident' (in memory), 'stream' (from disk, by tf.data), or 'auto':
  # streamed where the images do not fit half of the machine's memory.
  config.input = 'auto'
  # 'softmax' | 'mlp' | 'cnn' | 'package.module:factory' (docs/models.md).
  config.model = 'softmax'
  # Keras's optimizer by name (docs/training.md): 'sgd' | 'adam' | 'adamw' |
  # 'rmsprop' | 'adagrad' | 'adamax' | 'nadam' | 'lion'.
  config.optimizer = 'sgd'
  config.learning_rate = 0.5  # The peak of a schedule's.
  # The optimizer's arguments as Keras names them, each unset (None: Keras's
  # default) until set, e.g. --config.optimizer_args.momentum=0.9; which
  # optimizer takes which: docs/training.md.
  unset = ml_collections.config_dict.placeholder  # None, of a type.
  floats = 'momentum beta_1 beta_2 epsilon rho initial_accumulator_value'
  floats += ' weight_decay clipnorm clipvalue global_clipnorm ema_momentum'
  bools = 'nesterov amsgrad centered use_ema'
  config.optimizer_args = ml_collections.ConfigDict(
    {a: unset(float) for a in floats.split()}
    | {a: unset(bool) for a in bools.split()}
  )
  # The learning rate's schedule: 'constant', or 'cosine_decay' (Keras's
  # CosineDecay): a linear warm-up of warmup_steps from 0 to learning_rate,
  # then a cosine down to alpha * learning_rate over decay_steps. Unset: no
  # warm-up, the decay over the rest of the run, Keras's alpha 0.
  config.schedule = 'constant'
  config.schedule_args = ml_collections.ConfigDict(
    dict(warmup_steps=unset(int), decay_steps=unset(int), alpha=unset(float))
  )
  # Keras's dtype policy the model is built under (its mixed precision guide):
  # 'float32' | 'mixed_bfloat16' | 'mixed_float16' (loss-scaled, as by fit).
  config.precision = 'float32'
  config.batch_size = 100
  config.num_steps = 1000
  # The batch order: a run of this recipe ends on its last SGD step, so its
  # test accuracy swings with the seed by a few points; README's example
  # output is seed 1's.
  config.seed = 1
  config.jit = 'on'  # 'off' | 'on' | 'auto'; --jit overrides.
  config.device = 'auto'  # 'auto' | 'cpu' | 'gpu' | 'tpu'; --device overrides.
  # 'default' (one device) | 'mirrored' | 'multi_worker' | 'tpu'; --strategy.
  config.strategy = 'default'
  config.num_cpu_devices = 0  # > 0: mirror over that many logical CPUs.
  config.cpu_threads = 1  # TF's CPU thread pools; 1 is fastest here, 0 = TF's.
  # Training steps per call of the compiled function; 0 = the fastest for the
  # jit mode: a fused loop of 100 steps for 'on', 1 (per step) otherwise.
  config.steps_per_loop = 0
  config.log_every = 100  # Steps between progress lines and loss scalars.
  config.profile_steps = 5  # Trace the last steps (whole calls); 0 = off.
  config.dump_hlo = False  # Write what XLA made of the step; --dump_hlo too.
  config.checkpoint_every = 500  # Steps between checkpoints; 0 = at the end.
  config.keep_checkpoints = 3
  return config
