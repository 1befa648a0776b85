// Connections: per-tenant provider credentials (sealed), the providers' SDK clients behind the action
// tools, and outbound notifications (Standard Webhooks).
export { connectionsOf, ConnectionMissingError, viewOf } from './connections.js';
export { endpointView, notificationsOf, notifyBusyWaitMs, TRY_CUT_OFF, type NotificationJob, type NotificationSettings } from './notifications.js';
