"""The tests' private MariaDB with a binlog (the ``binlog_database`` fixture)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dataservice_tools.localservices import PrivateMariaDB, TemporaryBinlogMariaDB

from dataservice.config.settings import Settings


@dataclass(frozen=True)
class BinlogDatabase:
    """A MariaDB with a ROW binlog, migrated, with the change consumer's user."""

    server: TemporaryBinlogMariaDB
    database: str
    admin_url: str  # root: the service's own connection, and the tests' checks
    changes_url: str  # the consumer's user, with exactly `dataservice db changes-user`'s grants

    def stop(self) -> None:
        """Stop the server, keeping its data: :meth:`start` brings it back on its port."""
        # TemporaryBinlogMariaDB.stop would also delete the data.
        PrivateMariaDB.stop(self.server)

    def start(self) -> None:
        self.server.start()

    def on(self, settings: Settings) -> Settings:
        """``settings`` with the service and the consumer on this database."""
        return dataclasses.replace(
            settings, database_url=self.admin_url, changes_database_url=self.changes_url
        )
