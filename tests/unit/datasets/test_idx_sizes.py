"""IDX files are checked against their header and the machine's memory
before they are read: sparse giants, gzip bombs, negative counts."""

import gzip
import os
import tracemalloc

import pytest
from support.idx import (
  IDX_NAMES,
  bomb,
  idx_header,
  make_idx_folder,
  more_than_memory,
  sparse,
)

from xla_mnist.datasets import idx_builder, prepared
from xla_mnist.runtime.errors import DataError

IMAGES = IDX_NAMES['train'][0]


def bytes_read() -> int:
  """The bytes this thread has read through read() so far (Linux's rchar):
  what a check read of a file, without timing it."""
  with open('/proc/thread-self/io') as f:
    return int(next(x for x in f if x.startswith('rchar:')).split()[1])


def test_a_file_far_bigger_than_its_header_is_refused_unread(tmp_path):
  path = sparse(str(tmp_path / 'images'), idx_header(2051, 10), 40 << 30)
  before = bytes_read()
  with pytest.raises(DataError) as error:
    idx_builder.read_idx(path, 2051, (28, 28))
  assert bytes_read() - before < 1 << 20  # Its header, not 40 GiB.
  assert str(error.value) == (
    f'{path} is truncated or padded: {40 << 30} bytes, its header announces'
    f' 10 items ({16 + 7840} bytes): replace the file'
  )


def test_a_header_that_promises_more_than_the_file_is_refused(tmp_path):
  path = sparse(str(tmp_path / 'images'), idx_header(2051, 60000), 1000)
  with pytest.raises(DataError, match='1000 bytes, its header announces 60000'):
    idx_builder.read_idx(path, 2051, (28, 28))


@pytest.mark.parametrize('gzipped', [False, True])
def test_a_header_beyond_memory_is_refused_before_reading(tmp_path, gzipped):
  count = more_than_memory()
  head = idx_header(2051, count)
  path = str(tmp_path / f'images{".gz" * gzipped}')
  if gzipped:
    bomb(path, head, 0)
  else:
    sparse(path, head, 16 + count * 784)  # Sparse: as big as it promises.
  with pytest.raises(DataError) as error:
    idx_builder.read_idx(path, 2051, (28, 28))
  message = str(error.value)
  assert message.startswith(f'{path}: its header announces {count} items')
  assert 'MiB available: use a smaller IDX file or free memory' in message


def test_a_gzip_bomb_is_unzipped_no_further_than_its_header(tmp_path):
  # Small enough for the header's count: only unzipping can tell.
  path = bomb(str(tmp_path / 'labels.gz'), idx_header(2049, 10**5), 64 << 20)
  assert os.path.getsize(path) < 10**5
  tracemalloc.start()
  try:
    with pytest.raises(
      DataError, match=r': 100009 bytes, its header announces'
    ):
      idx_builder.read_idx(path, 2049, ())
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert peak < 8 << 20  # It stopped there: 64 MiB unzipped were not held.


def test_a_gzip_file_bigger_than_its_header_allows_is_refused_unread(
  tmp_path,
):
  path = bomb(str(tmp_path / 'labels.gz'), idx_header(2049, 10), 64 << 20)
  with pytest.raises(DataError, match=r'bytes gzipped, its header announces'):
    idx_builder.read_idx(path, 2049, ())


def test_gzip_files_of_several_members_and_padding_still_read(tmp_path):
  path = str(tmp_path / 'labels.gz')
  with open(path, 'wb') as f:
    f.write(gzip.compress(idx_header(2049, 3) + b'\1'))
    f.write(gzip.compress(b'\2\3') + bytes(100))
  labels = idx_builder.read_idx(path, 2049, ())
  assert labels.tolist() == [1, 2, 3]


def test_a_negative_count_is_refused(tmp_path):
  path = sparse(str(tmp_path / 'labels'), idx_header(2049, -5), 12)
  with pytest.raises(DataError, match='announces -5 items: not an IDX file'):
    idx_builder.read_idx(path, 2049, ())


def test_identify_checks_sizes_before_hashing(tmp_path):
  make_idx_folder(str(tmp_path))
  path = os.path.join(tmp_path, IMAGES)
  os.remove(path)
  sparse(path.removesuffix('.gz'), idx_header(2051, 300), 40 << 30)
  before = bytes_read()
  with pytest.raises(DataError, match='is truncated or padded: 42949672960'):
    prepared.identify(str(tmp_path), idx_builder.hash_file)
  # Its header: the 40 GiB were not hashed.
  assert bytes_read() - before < 1 << 20
