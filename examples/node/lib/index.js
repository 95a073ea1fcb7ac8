'use strict';
// A small caller library of dataservice's access.v2 protocol (docs/protocol.md).
module.exports = {
  ...require('./proto'),
  ...require('./envelope'),
  ...require('./answers'),
  ...require('./redis-broker'),
  ...require('./amqp-broker'),
  ...require('./client'),
};
