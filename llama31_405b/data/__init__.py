"""Data: C4 shards to Megatron indexed datasets, the tokenizer, verification, training datasets.

One module per concern:
  errors     DataError
  tokenizer  load_tokenizer / train_tokenizer (sentencepiece, Mixtral's model or the tiny one)
  reader     C4 json.gz documents with bad-input checks
  indexed    structure of Megatron .bin/.idx files
  binfile    reading a .bin by pread, never a map, with a check that it did not change (training)
  manifest   sizes and checksums of prepared files
  progress   progress line (docs/s, tokens/s, ETA) on stderr
  unit       one work unit of prepare: shards -> a part's .bin/.idx, in a worker process
  prepare    parallel, resumable tokenization into indexed datasets (units, merge, manifest)
  parity     the tokenizer against the folder's tokenizer.json, at prepare time
  layout     the benchmark's file layout (raw shards -> en_6 / en_7 / validation)
  verify     verify_data(cfg): content checks (`data verify`), require_verified(cfg) /
             check_metadata(cfg): train's checks
  datasets   build_datasets(cfg, seed=, train_samples=): blended GPTDataset + packed validation
  index_share  the .idx arrays a read needs: one read-only copy per node in shared memory
  tiny       ensure_tiny_data(data_dir): the tiny corpus, tokenizer and datasets
"""
from .errors import DataError

__all__ = ["DataError"]
