// Connections: per-tenant provider credentials (sealed), the providers' SDK clients behind the action tools.
export {
  connectionsOf,
  ConnectionMissingError,
  viewOf,
  type Connections,
  type ConnectionInput,
  type ConnectionPatch,
  type ConnectionSettings,
  type ConnectionView,
} from './connections.js';
export { ProviderError, type ProviderErrorCode } from './retry.js';
export { endpointView, notificationsOf, type EndpointView, type Notifications, type NotificationJob, type NotificationSettings } from './notifications.js';
