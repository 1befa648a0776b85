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
  type OpenConnection,
} from './connections.js';
export { callProvider, ProviderError, type ProviderErrorCode } from './retry.js';
