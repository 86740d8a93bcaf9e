"""What the app calls: the ``Workspace`` (banks, uploads and background jobs; ``workspace``), each bank's loaded
memory and conversation (``sessions``), what a request is asked with and streams back (``replies``), the job queue
(``jobs``) and the classifier builder (``classifier_builder``). No UI code: ``app/`` is the only Gradio.

The names the app's UI uses are exported here, so ``app/`` imports the library through this package alone
(``tests/test_layers.py``): the requests and replies, the errors it shows, the file kinds it accepts, the finders
and the classifier presets it offers."""

from longmem.ingest.formats import BOOK_SUFFIXES, DEMO_SUFFIXES
from longmem.ingest.readers import DemoFormat
from longmem.model.backbone import DTYPES, BackboneError
from longmem.model.longmem import CheckpointError
from longmem.service.jobs import JobState
from longmem.service.replies import CONTINUE, ChunkHit, Reply, Settings
from longmem.service.workspace import BankSummary, Workspace
from longmem.storage.records import BankError
from longmem.tasks.examples import PRESETS, peek_columns
from longmem.tasks.reading import FINDERS, READING_TOPK, Citation
from longmem.text.io import InputError

__all__ = ["BOOK_SUFFIXES", "CONTINUE", "DEMO_SUFFIXES", "DTYPES", "FINDERS", "PRESETS", "READING_TOPK",
           "BackboneError", "BankError", "BankSummary", "CheckpointError", "ChunkHit", "Citation", "DemoFormat",
           "InputError", "JobState", "Reply", "Settings", "Workspace", "peek_columns"]
