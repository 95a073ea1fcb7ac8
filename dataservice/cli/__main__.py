"""``python -m dataservice.cli``: the ``dataservice`` command, as the service's
own tools start it."""

from dataservice.cli import main

if __name__ == "__main__":
    main()
