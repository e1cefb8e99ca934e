"""The errors chexflow reports to users as a one-line message instead of a traceback."""


class ChexflowError(Exception):
    """Base class: bad input or a failed step, with a message that names the file/field/job."""
